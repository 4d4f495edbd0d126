"""Views every worker serves: ``/metrics``, ``/health``, ``/ready``, and its own consumer-lag export.

``install_common_views(app, group)`` is called once by every agent-group module. It

* adds ``GET /openapi.json`` (:mod:`app.platform.http.openapi`: the worker's own routes),
  ``GET /metrics`` (Prometheus text of :data:`app.platform.metrics.REGISTRY`), ``GET /health``
  (liveness: the event loop answers and the app has not crashed) and ``GET /ready`` (readiness:
  200 once the worker has partitions assigned and its tables are recovered; 503 with a JSON
  ``reason`` otherwise; a group without a Kafka consumer, e.g. the HTTP-only gateway, is ready
  once started);
* turns the faust Kafka consumer off for an App that defines no agents and no tables (faust
  crashes at start when asked to subscribe to nothing);
* starts a small service exporting ``avcc_consumer_lag_messages`` for the partitions assigned to
  THIS worker (end offset - committed offset of its group), so a scrape of any worker shows its
  share of its group's lag. Series of partitions the worker loses in a rebalance are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import faust
from mode import Service
from prometheus_client import generate_latest

from app.ops.lag.bounded import call_within
from app.ops.lag.reader import OffsetReader
from app.ops.lag.settings import LagSettings
from app.ops.lag.snapshot import PartitionOffsets
from app.ops.watchdog import (
    RecoveryWatch,
    StallWatchdog,
    exit_recovery_stalled,
    exit_stalled,
)
from app.platform.faust.app import consumer_group_id
from app.platform.faust.batches import offsets_view
from app.platform.faust.recovery import table_recovery
from app.platform.groups import GROUPS
from app.platform.http.nonces import NonceLedger, nonce_store
from app.platform.http.openapi import install_openapi
from app.platform.metrics import CONSUMER_LAG, LAG_MONITOR_ERRORS, REGISTRY
from app.platform.settings import Settings, get_settings

__all__ = [
    "METRICS_CONTENT_TYPE",
    "AssignmentSource",
    "ReadyCheck",
    "WorkerLagExporter",
    "WorkerState",
    "install_common_views",
    "readiness",
]

log = logging.getLogger(__name__)

#: Prometheus text exposition format 0.0.4 (``generate_latest`` writes it for our metric names;
#: prometheus_client >= 0.22 would announce 1.0.0, which older scrapers do not know).
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INSTALLED_ATTR = "_avcc_common_views"


#: Partitions a group's own (non-faust) consumer owns: ``(topic, partition)`` pairs.
AssignmentSource = Callable[[], Iterable[tuple[str, int]]]
#: Extra readiness check of a group: ``(ready, reason)``.
ReadyCheck = Callable[[], tuple[bool, str]]


@dataclass(slots=True)
class WorkerState:
    """What the views need to know about their worker beyond the faust App itself."""

    group: str
    #: ``None`` until the worker initialises; then whether the App runs faust's Kafka consumer.
    consumer: bool | None = None
    #: Set once the App has fully started (after table recovery; its tasks are running).
    started: bool = False
    #: Assignment of a consumer the group runs itself (sink, anomaly, retry use confluent-kafka).
    assignment: AssignmentSource | None = field(default=None, repr=False)
    #: The group's own readiness condition, checked once the App has started.
    ready_check: ReadyCheck | None = field(default=None, repr=False)
    exporter: WorkerLagExporter | None = field(default=None, repr=False)
    #: The shared nonce store of a group that serves signed routes (``None``: none, or local).
    nonces: NonceLedger | None = field(default=None, repr=False)


def _uses_consumer(app: faust.App) -> bool:
    return bool(app.agents) or bool(app.tables)


def _faust_consumer(app: faust.App) -> Any:
    """faust's consumer of an App that consumes with it (``None`` for one that does not)."""
    return app.consumer if _uses_consumer(app) else None


def readiness(app: faust.App, state: WorkerState) -> tuple[bool, dict[str, Any]]:
    """``(ready, body)`` of ``GET /ready``.

    Ready = started, and: with faust's consumer, partitions assigned and tables recovered; with an
    own consumer (``state.assignment``), partitions assigned; plus ``state.ready_check`` if given.
    A group without any consumer (the HTTP-only gateway) is ready once started. The body is
    open to anyone who can reach the port: it says why not ready in fixed words, never with
    exception text (which may name hosts or carry credentials).
    """
    body: dict[str, Any] = {"group": state.group}
    if getattr(app, "crashed", False):
        return False, {**body, "status": "crashed", "reason": "the app crashed"}
    if not state.started:
        return False, {**body, "status": "starting", "reason": "worker still starting (or recovering tables)"}
    consumer = state.consumer if state.consumer is not None else _uses_consumer(app)
    partitions: int | None = None
    if consumer:
        faust_consumer = _faust_consumer(app)
        try:
            assignment = faust_consumer.assignment() if faust_consumer is not None else None
        except Exception:  # ConsumerNotStarted and friends: not ready yet
            assignment = None
        if assignment is None:
            return False, {**body, "status": "starting", "reason": "consumer not started"}
        if not assignment:
            return False, {**body, "status": "unassigned", "reason": "no partitions assigned to this worker"}
        recovery = cast(Any, app.tables).recovery
        if not recovery.completed.is_set() or getattr(app, "in_recovery", False):
            return False, {
                **body,
                "status": "recovering",
                "reason": "tables are being recovered from changelogs",
            }
        restores = table_recovery(app)
        tables = restores.progress() if restores is not None else []
        restoring = [t for t in tables if t.recovering]
        if restoring:
            return False, {
                **body,
                "status": "recovering",
                "reason": "; ".join(t.describe() for t in restoring),
                "tables": [t.as_dict() for t in tables],
            }
        if tables:
            body["tables"] = [t.as_dict() for t in tables]
        partitions = len(assignment)
    elif state.assignment is not None:
        try:
            owned = list(state.assignment())
        except Exception as exc:  # the group's consumer is not up yet (the detail is for the log)
            log.debug("readiness of %s: consumer not started: %s", state.group, exc)
            return False, {**body, "status": "starting", "reason": "consumer not started"}
        if not owned:
            return False, {**body, "status": "unassigned", "reason": "no partitions assigned to this worker"}
        consumer, partitions = True, len(owned)
    if state.ready_check is not None:
        ok, reason = state.ready_check()
        if not ok:
            return False, {**body, "status": "not_ready", "reason": reason}
    if state.nonces is not None and not state.nonces.ready:
        return False, {**body, "status": "not_ready", "reason": "reading the nonces of the skew window"}
    ready: dict[str, Any] = {**body, "status": "ready", "consumer": bool(consumer)}
    if partitions is not None:
        ready["partitions"] = partitions
    return True, ready


#: A worker's lag reading is given up after this many of the reader's request timeouts.
EXPORT_TIMEOUTS = 3


class WorkerLagExporter:
    """Exports the lag of the partitions assigned to this worker into ``CONSUMER_LAG``."""

    def __init__(
        self,
        app: faust.App,
        group: str,
        *,
        settings: Settings | None = None,
        config: LagSettings | None = None,
        reader_factory: Callable[[], OffsetReader] | None = None,
        assignment: AssignmentSource | None = None,
    ) -> None:
        self.app = app
        self.group_id = consumer_group_id(group)
        self._settings = settings
        self._config = config if config is not None else LagSettings()
        self._reader_factory = reader_factory
        self._assignment = assignment
        self._reader: OffsetReader | None = None
        self._exported: set[tuple[str, str, str]] = set()

    def _get_reader(self) -> OffsetReader:
        if self._reader is None:
            if self._reader_factory is not None:
                self._reader = self._reader_factory()
            else:
                self._reader = OffsetReader(self._settings or get_settings(), self._config)
        return self._reader

    def assigned(self) -> list[tuple[str, int]]:
        """Source partitions assigned to this worker (changelogs, the reply topic and faust's leader
        topic excluded)."""
        if self._assignment is not None:
            try:
                return sorted(set(self._assignment()))
            except Exception:  # the group's own consumer is not up: nothing assigned
                return []
        consumer = _faust_consumer(self.app)
        if consumer is None:
            return []
        try:
            assignment = consumer.assignment()
        except Exception:  # consumer not started (yet): nothing assigned
            return []
        skip: set[str] = set(self.app.tables.changelog_topics)
        skip.add(str(self.app.conf.reply_to))  # replies are never committed (ack-free topic)
        skip |= set(getattr(consumer, "randomly_assigned_topics", ()) or ())
        return sorted(
            (tp.topic, tp.partition)
            for tp in assignment
            if tp.topic not in skip
            and "-__assignor-__leader" not in tp.topic
            and not tp.topic.startswith("__")
        )

    def export_timeout_s(self) -> float:
        """Longest wait for one reading: a few of the reader's request timeouts."""
        return EXPORT_TIMEOUTS * self._config.request_timeout_s

    async def export_once(self) -> list[PartitionOffsets]:
        """Read and export the lag of the assigned partitions once.

        A reading that does not answer within :meth:`export_timeout_s` is given up and its reader
        dropped (closed once its call returns, :func:`call_within`); the next round asks a fresh
        one. Seen after an Apache Kafka restart: the reader's ``committed()`` never returned,
        every later round waited behind it, and the stall watchdog, fed by these readings, never
        fired while the worker's commits had stopped for 13 minutes.
        """
        tps = self.assigned()
        rows: list[PartitionOffsets] = []
        if tps:
            reader = self._get_reader()
            timeout = self.export_timeout_s()
            try:
                read = partial(reader.group_offsets, self.group_id, tps)
                rows = await call_within(read, timeout, reader.close)
            except TimeoutError:
                LAG_MONITOR_ERRORS.labels(stage="worker_export").inc()
                log.warning(
                    "lag export of %s did not answer in %.0f s; asking a new reader next round",
                    self.group_id,
                    timeout,
                )
                if self._reader is reader:
                    self._reader = None
                return []
            except Exception as exc:  # the broker may be away for a moment; try again next round
                LAG_MONITOR_ERRORS.labels(stage="worker_export").inc()
                log.warning("lag export of %s failed: %s", self.group_id, exc)
                return []
        current: set[tuple[str, str, str]] = set()
        for row in rows:
            labels = (row.group, row.topic, str(row.partition))
            CONSUMER_LAG.labels(*labels).set(row.lag)
            current.add(labels)
        for labels in self._exported - current:
            with contextlib.suppress(KeyError):
                CONSUMER_LAG.remove(*labels)
        self._exported = current
        return rows

    def close(self) -> None:
        """Close the reader's clients and drop this worker's series."""
        for labels in self._exported:
            with contextlib.suppress(KeyError):
                CONSUMER_LAG.remove(*labels)
        self._exported = set()
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def recovery_remaining(app: Any) -> int | None:
    """Changelog records the worker's table recovery still has to read, faust's and the
    project's restores together (``None``: not recovering)."""
    restores = table_recovery(app)
    restoring = sum(t.remaining for t in restores.progress()) if restores is not None else 0
    try:
        manager = app.tables
        if not manager.recovery.in_recovery:
            return restoring or None
        return int(manager.recovery.active_remaining_total()) + restoring
    except Exception:  # no tables (yet): nothing to recover
        return restoring or None


def _exporter_service(
    exporter: WorkerLagExporter, interval_s: float, watchdog: StallWatchdog | None = None, app: Any = None
) -> type[Any]:
    """A mode Service class (``app.service`` instantiates it) running ``exporter`` periodically,
    and the stall ``watchdog`` on its readings (logging ``app``'s consumer view on a stall)."""

    recovery = RecoveryWatch(watchdog.stall_s) if watchdog is not None and app is not None else None

    class WorkerLagExportService(Service):
        """Exports this worker's consumer lag every ``interval_s`` seconds."""

        @Service.task
        async def _export(self) -> None:
            while not self.should_stop:
                rows = await exporter.export_once()
                if watchdog is not None and rows:
                    stalled = watchdog.observe(rows, time.monotonic())
                    if stalled:
                        view = offsets_view(app, stalled) if app is not None else ""
                        exit_stalled(exporter.group_id, stalled, watchdog.stall_s, rows, view)
                if recovery is not None:
                    remaining = recovery_remaining(app)
                    if recovery.observe(remaining, time.monotonic()):
                        exit_recovery_stalled(exporter.group_id, remaining or 0, recovery.stall_s)
                await self.sleep(interval_s)

        async def on_stop(self) -> None:
            await asyncio.to_thread(exporter.close)

    return WorkerLagExportService


def _nonce_service(ledger: NonceLedger) -> type[Any]:
    """A mode Service class that starts the shared nonce ledger with the worker and stops it."""

    class NonceLedgerService(Service):
        """Reads ``topic.system.nonces`` for the signed routes of this worker."""

        async def on_start(self) -> None:
            await asyncio.to_thread(ledger.start)

        async def on_stop(self) -> None:
            await asyncio.to_thread(ledger.stop)

    return NonceLedgerService


def install_common_views(
    app: faust.App,
    group: str,
    *,
    export_lag: bool = True,
    lag_config: LagSettings | None = None,
    assignment: AssignmentSource | None = None,
    ready_check: ReadyCheck | None = None,
) -> WorkerState:
    """Add ``/metrics``, ``/health``, ``/ready`` and the per-worker lag export to ``app``.

    A group serving signed ``/v1/`` routes (``GroupSpec.signed_routes``) reads the shared nonce
    store (``AVCC_NONCE_STORE=kafka``) from the start and is ready once it has caught up.
    ``export_lag=False`` for the ops App, whose lag monitor exports every group's lag itself.
    A group that consumes with its own client instead of faust agents (sink, anomaly, retry)
    passes ``assignment`` (its consumer's ``(topic, partition)`` pairs) so ``/ready`` and the lag
    export follow that consumer, and may pass ``ready_check``. Calling it twice for the same App
    returns the first state and adds nothing.
    """
    existing = getattr(app, _INSTALLED_ATTR, None)
    if isinstance(existing, WorkerState):
        return existing
    state = WorkerState(group=group, assignment=assignment, ready_check=ready_check)
    setattr(app, _INSTALLED_ATTR, state)
    if any(spec.name == group and spec.signed_routes for spec in GROUPS):
        store = nonce_store(get_settings())
        if isinstance(store, NonceLedger):
            state.nonces = store
            app.service(_nonce_service(store))

    @app.on_worker_init.connect
    def _decide_consumer(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        state.consumer = _uses_consumer(app)
        if not state.consumer:
            # faust subscribes to an empty topic list and crashes otherwise.
            app.boot_strategy.enable_kafka_consumer = False

    async def _mark_started() -> None:
        # App tasks start after table recovery, so this is "fully started".
        state.started = True

    _mark_started.__name__ = f"avcc_{group}_mark_started"
    app.task(_mark_started)

    async def metrics(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.bytes(generate_latest(REGISTRY), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def health(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        if getattr(app, "crashed", False):
            return self.json({"status": "crashed", "group": group}, status=503)
        return self.json({"status": "ok", "group": group})

    async def ready(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        ok, body = readiness(app, state)
        return self.json(body, status=200 if ok else 503)

    app.page("/metrics", name=f"avcc_{group}_metrics")(metrics)
    app.page("/health", name=f"avcc_{group}_health")(health)
    app.page("/ready", name=f"avcc_{group}_ready")(ready)
    install_openapi(app, group)

    if export_lag:
        config = lag_config if lag_config is not None else LagSettings()
        exporter = WorkerLagExporter(app, group, config=config, assignment=assignment)
        state.exporter = exporter
        # the watchdog guards faust's consumer; groups with their own consumer (sink, anomaly,
        # retry) pause on purpose (e.g. during a ClickHouse outage) and handle their clients
        stall_s = get_settings().worker_stall_s
        watchdog = StallWatchdog(stall_s) if assignment is None and stall_s > 0 else None
        app.service(_exporter_service(exporter, config.export_interval_s, watchdog, app))
    return state
