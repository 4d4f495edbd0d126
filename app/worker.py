"""One agent group's worker process (``avcc worker GROUP``): its topics checked, faust run, and a
worker whose tables are ahead of the broker told apart from any other crash.

faust stops a worker whose local table (RocksDB) has recorded a changelog offset past the end of
that changelog on the broker (``ConsistencyError``: "The persisted offset for changelog topic
partition ... is higher than the last offset in that topic"). That happens when the broker's data
was deleted or replaced while the worker's data dir was kept, and no restart can mend it. faust
exits with status 1 then, like for any crash, so a supervisor would restart it in a loop; here it
exits with :data:`EXIT_TABLES_AHEAD_OF_BROKER` and one log line saying what to delete.
"""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

from app.platform.faust.recovery import EXIT_TABLES_AHEAD_OF_BROKER, tables_ahead_of_broker
from app.platform.groups import GroupSpec

__all__ = ["EXIT_TABLES_AHEAD_OF_BROKER", "run_worker", "tables_ahead_of_broker"]

log = logging.getLogger("avcc.worker")


def run_worker(spec: GroupSpec, args: list[str]) -> NoReturn:
    """Create or verify the group's topics, then run faust's worker with ``args``; never returns."""
    from app.platform.internal_topics import group_app, worker_topics
    from app.platform.kafka.access import KafkaAccessRefused, check_kafka_access, refused_by_acl
    from app.platform.kafka.admin import apply_plan
    from app.platform.settings import get_settings

    app = group_app(spec)
    settings = get_settings()
    try:
        check_kafka_access(settings, spec)
        report = apply_plan(settings, worker_topics(spec))
    except KafkaAccessRefused as exc:
        log.critical("%s", exc)
        raise SystemExit(exc.exit_code) from None
    except Exception as exc:
        refusal = refused_by_acl(exc, settings, spec)
        if refusal is None:
            raise
        log.critical("%s", refusal)
        raise SystemExit(refusal.exit_code) from None
    if report.unfixed:
        for drift in report.unfixed:
            print(f"drift: {drift.line()}", file=sys.stderr)
        raise SystemExit(f"group {spec.name}: its changelog topics drift from its tables; fix them first")
    args = list(args)
    if "--web-port" not in args:
        args += ["--web-port", str(settings.web_port + spec.port_offset)]
    if "--web-bind" not in args and "-b" not in args:
        args += ["--web-bind", settings.web_host]
    if "-l" not in args and "--loglevel" not in args:
        level = settings.log_level.lower()
        args += ["-l", {"warning": "warn", "critical": "crit"}.get(level, level)]
    sys.argv = [f"avcc-{spec.name}", "worker", *args]
    try:
        app.main()
    except SystemExit:
        reason = tables_ahead_of_broker(app)
        if reason is None:
            raise
        log.critical(
            "group %s stops: its tables in %s are ahead of the broker's changelogs (%s). The broker's "
            "data was deleted or replaced while this data dir was kept; a restart cannot mend it. "
            "Delete %s (its tables are then rebuilt from the broker), or `make clean` for a fresh stack.",
            spec.name,
            app.conf.datadir,
            reason,
            app.conf.datadir,
        )
        raise SystemExit(EXIT_TABLES_AHEAD_OF_BROKER) from None
    raise SystemExit(0)
