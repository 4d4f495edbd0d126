"""Views every worker serves: ``/metrics``, ``/health``, ``/ready``, and its own consumer-lag export.

Readiness is decided in :mod:`app.platform.faust.readiness`, the lag export and the stall
watchdog run from :mod:`app.platform.lag.export`.

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
import logging
from typing import Any

import faust
from mode import Service
from prometheus_client import generate_latest

from app.platform.faust.readiness import AssignmentSource, ReadyCheck, WorkerState, readiness, uses_consumer
from app.platform.groups import GROUPS
from app.platform.http.nonces import NonceLedger, nonce_store
from app.platform.http.openapi import install_openapi
from app.platform.lag.export import WorkerLagExporter, lag_export_service
from app.platform.lag.settings import get_lag_read_settings
from app.platform.lag.watchdog import StallWatchdog
from app.platform.metrics import REGISTRY
from app.platform.settings import get_settings

__all__ = ["METRICS_CONTENT_TYPE", "install_common_views"]

log = logging.getLogger(__name__)

#: Prometheus text exposition format 0.0.4 (``generate_latest`` writes it for our metric names;
#: prometheus_client >= 0.22 would announce 1.0.0, which older scrapers do not know).
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INSTALLED_ATTR = "_avcc_common_views"


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
        state.consumer = uses_consumer(app)
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
        config = get_lag_read_settings()
        exporter = WorkerLagExporter(app, group, config=config, assignment=assignment)
        # the watchdog guards faust's consumer; groups with their own consumer (sink, anomaly,
        # retry) pause on purpose (e.g. during a ClickHouse outage) and handle their clients
        stall_s = get_settings().worker_stall_s
        watchdog = StallWatchdog(stall_s) if assignment is None and stall_s > 0 else None
        app.service(lag_export_service(exporter, config.export_interval_s, watchdog, app))
    return state
