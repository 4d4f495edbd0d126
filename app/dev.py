"""The local all-in-one stack: embedded Tansu broker, chDB, the topic plan and every agent group.

DEV ONLY: Tansu runs on memory storage (everything is lost when it stops), the shipped HMAC key
``dev``/``dev-secret`` and operator ``admin``/``admin`` are enabled, and a broker that cannot
honour the core producer profile is only warned about.

Supervision (``app/supervisor``): every port the stack needs is checked before anything starts
(exit status 2 naming the port and its holder); a group that exits is restarted with exponential
backoff and never stops the others; the broker is watched, and when it dies the stack stops with
exit status 1 (a restarted memory broker would be empty: no topics, offsets or changelogs).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import time
from pathlib import Path
from types import FrameType

from app.dev_chain import DevChain, dev_chain_port, start_dev_chain
from app.platform.groups import GROUPS, GroupSpec
from app.platform.kafka.admin import apply_plan
from app.platform.redaction import redact_url
from app.platform.settings import Settings, get_settings
from app.servers.process import LOOPBACK, ServerStartError
from app.servers.tansu import TansuBroker
from app.supervisor import (
    GroupSupervisor,
    PortClaim,
    PortInUse,
    SupervisorSettings,
    describe_exit,
    port_holders,
    require_free_ports,
)

__all__ = ["EXIT_BROKER_LOST", "EXIT_PORT_IN_USE", "run_dev_stack"]

#: Exit status of ``avcc dev`` when a port it needs is taken (nothing was started).
EXIT_PORT_IN_USE = 2
#: Exit status when the embedded broker failed to start or died while the stack ran.
EXIT_BROKER_LOST = 1

log = logging.getLogger("avcc.dev")

BANNER = """
==============================================================================
 AVCC dev stack — DEV ONLY
   * embedded Tansu broker on {bootstrap} (memory storage: lost on restart)
   * ClickHouse: {clickhouse}
   * chain: {chain}
   * HMAC API key 'dev' / secret 'dev-secret' is ENABLED (never use outside dev)
   * operator console login admin / admin
 Console: http://{host}:{port}/dlq   lag: http://{host}:{port}/lag
 Apply:   POST http://{host}:{code_port}/v1/avcc/applications
==============================================================================
"""


def available_groups(wanted: list[str] | None) -> list[GroupSpec]:
    """Groups whose agent module exists (optionally only those named)."""
    found = [g for g in GROUPS if importlib.util.find_spec(g.module) is not None]
    if wanted:
        unknown = set(wanted) - {g.name for g in GROUPS}
        if unknown:
            raise SystemExit(f"unknown groups: {', '.join(sorted(unknown))}")
        found = [g for g in found if g.name in wanted]
    return found


def _child_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["AVCC_DEV_MODE"] = "true"
    env["AVCC_DATA_DIR"] = str(settings.data_dir.resolve())
    env.setdefault("AVCC_KAFKA_URL", settings.kafka_url)
    return env


def run_dev_stack(wanted: list[str] | None = None, *, start_broker: bool = True, chain: str = "local") -> int:
    """Start everything, wait for Ctrl-C/SIGTERM, then stop everything. Returns an exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ["AVCC_DEV_MODE"] = "true"
    get_settings.cache_clear()
    settings = get_settings()
    settings.check_bind()
    groups = available_groups(wanted)
    try:
        claims = _port_claims(settings, groups, start_broker)
        if chain == "evm":
            claims.append(PortClaim("the ganache dev chain", LOOPBACK, dev_chain_port(settings)))
        require_free_ports(claims)
    except PortInUse as exc:
        log.error("avcc dev cannot start: %s", exc)
        return EXIT_PORT_IN_USE
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    broker: TansuBroker | None = None
    dev_chain: DevChain | None = None
    supervisor: GroupSupervisor | None = None
    stopping = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        if start_broker:
            try:
                broker = _start_broker(settings, data_dir)
            except ServerStartError as exc:
                log.error("avcc dev cannot start its broker: %s", exc)
                return EXIT_BROKER_LOST
            log.info("embedded Tansu broker on %s (pid %s)", broker.bootstrap, broker.pid)
        if chain == "evm":
            dev_chain = start_dev_chain(data_dir, dev_chain_port(settings))
            log.info("ganache dev chain on %s, AvccRegistry at %s", dev_chain.node.url, dev_chain.env)
        report = apply_plan(settings)
        for name in report.created:
            log.info("created topic %s", name)
        for drift in report.unfixed:
            log.error("topic drift: %s", drift.line())
        env = {**_child_env(settings), **(dev_chain.env if dev_chain else {})}
        supervisor = GroupSupervisor(
            groups,
            env=env,
            logs=data_dir / "logs",
            policy=SupervisorSettings().policy(),
            web_port=lambda group: settings.web_port + group.port_offset,
        )
        supervisor.start_all()
        if broker is not None and not broker.running:
            log.error("avcc dev: %s", _broker_gone(broker))
            return EXIT_BROKER_LOST
        print(
            BANNER.format(
                bootstrap=settings.kafka_bootstrap,
                clickhouse=redact_url(settings.clickhouse_url),
                chain=redact_url(env.get("AVCC_CHAIN_URL", settings.chain_url)),
                host=settings.web_host,
                port=settings.web_port,
                code_port=settings.web_port + 1,
            ),
            flush=True,
        )
        while not stopping:
            if broker is not None and not broker.running:
                log.error("avcc dev: %s", _broker_gone(broker))
                return EXIT_BROKER_LOST
            supervisor.tick()
            time.sleep(0.5)
        return 0
    finally:
        if supervisor is not None:
            supervisor.stop()
        if broker is not None:
            broker.stop()
        if dev_chain is not None:
            dev_chain.stop()
        log.info("dev stack stopped")


def _port_claims(settings: Settings, groups: list[GroupSpec], start_broker: bool) -> list[PortClaim]:
    """Every port the stack will listen on: the embedded broker's and each group's web port."""
    claims = [
        PortClaim(f"the web server of group {g.name}", settings.web_host, settings.web_port + g.port_offset)
        for g in groups
    ]
    if start_broker:
        claims.insert(0, PortClaim("the embedded Kafka broker (Tansu)", LOOPBACK, _broker_port(settings)))
    return claims


def _broker_port(settings: Settings) -> int:
    return int(settings.kafka_bootstrap.split(",")[0].rsplit(":", 1)[1])


def _start_broker(settings: Settings, data_dir: Path) -> TansuBroker:
    """Start Tansu and make sure the broker that answers on its port is this very process."""
    broker = TansuBroker(data_dir / "tansu", port=_broker_port(settings))
    broker.start()
    holders = port_holders(broker.port)
    if not broker.running or (holders and broker.pid not in holders):
        held_by = ", ".join(f"pid {pid} ({name})" for pid, name in sorted(holders.items()))
        broker.stop()
        raise ServerStartError(
            f"port {broker.port} answers Kafka requests, but not from the embedded Tansu broker "
            f"(held by {held_by or 'an unknown process'}); stop it or set AVCC_KAFKA_URL"
        )
    return broker


def _broker_gone(broker: TansuBroker) -> str:
    """Why the stack stops when its broker died, with the end of the broker's log."""
    status = broker.process.returncode if broker.process is not None else None
    how = describe_exit(status) if status is not None else "exited"
    tail = broker.process.log_tail(2000) if broker.process is not None else ""
    return (
        f"the embedded Tansu broker on {broker.bootstrap} is gone ({how}). Its memory storage went "
        "with it (every topic, record, committed offset and changelog), so the stack stops instead "
        f"of running the groups against an empty broker; start `avcc dev` again.\n{tail}"
    )
