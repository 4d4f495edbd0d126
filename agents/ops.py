"""Ops group: the consumer-lag monitor and the operator console (``/lag``, the DLQ console, ``/docs``).

Run with ``avcc worker ops`` (web port ``AVCC_WEB_PORT``, 6066 by default: the local stack's
console base URL). Every ``AVCC_LAG_INTERVAL_S`` seconds the monitor snapshots every consumer
group's offsets, evaluates the seed's lag rules (9.3.4), exports ``avcc_consumer_lag_messages``,
``avcc_consumer_lag_status`` and ``avcc_lag_alert_active``, and sends alert lifecycle events to
the log and the Alertmanager webhook.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import faust
from aiohttp import web
from mode import Service

from app.api import ANOMALIES, DECIDE, RECORD_COUNTS, TASKS, TIME_TO_CODE, partner_document
from app.ops.api_docs import install_api_docs
from app.ops.console.live import install_live_script
from app.ops.console.peers import PartnerRoutes
from app.ops.console.views import install_home
from app.ops.dlq.console import install_console
from app.ops.lag.monitor import LagMonitor
from app.ops.lag.pages import lag_json, render_lag_html
from app.ops.lag.settings import get_lag_settings
from app.platform.faust.app import get_app
from app.platform.http.headers import LIVE_PAGE_POLICY
from app.platform.http.operators import OPERATOR_ATTRIBUTE
from app.platform.http.views import install_common_views
from app.platform.settings import get_settings

__all__ = ["LAG_CONFIG", "LagMonitorService", "app", "home", "lag"]

log = logging.getLogger(__name__)

app = get_app("ops")
#: Lag monitor settings (``AVCC_LAG_*``), read once at import.
LAG_CONFIG = get_lag_settings()
# The monitor exports every group's lag itself, so no per-worker export here.
common = install_common_views(app, "ops", export_lag=False)


class LagMonitorService(Service):
    """Runs :meth:`LagMonitor.tick` every ``AVCC_LAG_INTERVAL_S`` seconds, and holds the monitor
    while the worker runs (the pages read its last report)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.running: LagMonitor | None = None

    async def on_start(self) -> None:
        self.running = LagMonitor(get_settings(), LAG_CONFIG)

    @Service.task
    async def _run(self) -> None:
        while not self.should_stop:
            monitor = self.running
            if monitor is not None:
                try:
                    await monitor.tick()
                except Exception:  # the monitor must outlive any single failed round
                    log.exception("lag monitor round failed")
            await self.sleep(LAG_CONFIG.interval_s)

    async def on_stop(self) -> None:
        """Close the monitor's offset reader and alert sinks."""
        monitor, self.running = self.running, None
        if monitor is not None:
            await monitor.close()


#: The lag monitor, held by the service that runs it.
lag = LagMonitorService()
app.service(lag)  # type: ignore[arg-type]  # faust takes a service instance too


# ----------------------------------------------------------------------------- lag console
# Operator pages: the worker's middleware (app/platform/http/operators.py) asks for the login.


@app.page("/lag", name="avcc_ops_lag")
async def lag_page(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
    """The console's lag page: groups with status, lag and trend, partitions unfolding in place;
    its numbers update in place every ``AVCC_LAG_INTERVAL_S`` (the console's one script)."""
    monitor = lag.running
    report = monitor.last_report if monitor else None
    history = monitor.history if monitor else None
    user = cast(web.Request, request).get(OPERATOR_ATTRIBUTE)  # faust's aiohttp driver
    text = render_lag_html(report, refresh_s=LAG_CONFIG.interval_s, history=history, user=user)
    return self.html(text, headers={"Content-Security-Policy": LIVE_PAGE_POLICY})


@app.page("/lag.json", name="avcc_ops_lag_json")
async def lag_json_page(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
    """The latest report as JSON (``taken_at`` is null before the first snapshot)."""
    report = lag.running.last_report if lag.running else None
    return self.json(lag_json(report))


# ----------------------------------------------------------------------------- DLQ console
# The DLQ console (list / show / re-inject / discard, app/ops/dlq): a service with its own DLQ
# consumer and RocksDB store (tables/ops.py), plus the console's views. It adds no agents or
# tables, so this App's faust consumer stays off. Any number of ops workers may run: each one's
# store is a cache of the DLQ and its state topic (tables/ops.py), so all serve one view.
console = install_console(app, get_settings())
# Ready once the DLQ view is complete (every ops replica rebuilds it from Kafka on start).
common.ready_check = console.readiness

# The partner API document as HTML (app/ops/api_docs.py), behind the operator login.
install_api_docs(app, partner_document())
# ----------------------------------------------------------------------------- overview + review
# The home page (groups, topics, rates, records, DLQ, anomalies) and the human review workbench
# (app/ops/console): they reach the code, review and sink workers through their signed routes.
#: The other groups' routes the console calls.
partner_routes = PartnerRoutes(TASKS.path, DECIDE.path, RECORD_COUNTS.path, TIME_TO_CODE.path, ANOMALIES.path)
home = install_home(app, console, lambda: lag.running, partner_routes)
# The console's one script: the lag page's live numbers (app/ops/console/live.js).
install_live_script(app)
