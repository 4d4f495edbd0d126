"""Console handlers: the overview at ``/`` and the review workbench at ``/review``.

Both sit behind the operator login and the DLQ console's guard (cross-site POSTs refused, errors
mapped); the workbench's form additionally carries a :class:`FormTokens` token bound to the
operator. A decision is sent to the review worker's signed ``POST /v1/review/tasks/{id}/decision``
with the operator as ``reviewer``; the review worker records the console's key as ``decided_by_key``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import faust
from aiohttp import web

from app.ops.console.csrf import FormTokens
from app.ops.console.pages import ROUTE_HOME, Overview, overview_html
from app.ops.console.peers import PartnerRoutes, PeerError, Peers
from app.ops.console.rates import OffsetHistory
from app.ops.console.settings import ConsoleSettings, get_console_settings
from app.ops.console.workbench import ROUTE_DECIDE, ROUTE_REVIEW, WorkbenchQuery, workbench_html
from app.ops.console.workers import group_workers
from app.ops.dlq.console import DlqConsole, Handler, faust_view
from app.ops.dlq.entries import DlqError
from app.ops.lag.monitor import LagMonitor
from app.ops.slo.settings import get_slo_settings

__all__ = ["ConsoleHome", "install_home"]

log = logging.getLogger(__name__)

_PAST = {"approve": "approved", "reject": "rejected"}


class ConsoleHome:
    """Overview and workbench handlers over the lag monitor, the DLQ store and the peer workers."""

    def __init__(
        self,
        dlq: DlqConsole,
        monitor: Callable[[], LagMonitor | None],
        routes: PartnerRoutes,
        config: ConsoleSettings | None = None,
        *,
        tokens: FormTokens | None = None,
    ) -> None:
        self.dlq = dlq
        self.partner = routes
        self.config = config if config is not None else get_console_settings()
        self.monitor = monitor
        self.peers = Peers(dlq.settings, self.config)
        self.tokens = tokens if tokens is not None else FormTokens(ttl_s=self.config.form_token_ttl_s)
        self.objectives = get_slo_settings()
        #: The code replicas the last record counts named: asked when the configured one is away.
        self.code_replicas: list[str] = []

    async def _peer(self, group: str, path: str, errors: dict[str, str]) -> Any:
        try:
            return await self.peers.get_ok(group, path)
        except PeerError as exc:
            errors[group] = str(exc)
            return None

    async def _from_code(self, path: str, part: str, errors: dict[str, str]) -> Any:
        """A summary any code replica answers for all (it merges every replica's part): from the
        configured one, else a replica the group's assignment named in an earlier answer."""
        configured = self.config.peer_url(self.peers.settings, "code")
        others = [url for url in self.code_replicas if url != configured]
        try:
            answer = await self.peers.get_from_any("code", path, others)
        except PeerError as exc:
            errors[part] = str(exc)
            return None
        self.code_replicas = [str(r["url"]) for r in answer.get("replicas", ()) if r.get("url")]
        return answer

    async def home(self, request: web.Request, user: str) -> web.StreamResponse:
        """``GET /``."""
        errors: dict[str, str] = {}
        counts, times, anomalies, workers = await asyncio.gather(
            self._from_code(self.partner.record_counts, "code", errors),
            self._from_code(self.partner.time_to_code, "time to code", errors),
            self._peer("sink", f"{self.partner.anomalies}?limit=10", errors),
            group_workers(self.peers.settings, self.config),
        )
        try:
            dlq_counts: Mapping[str, int] | None = self.dlq.store.counts()
        except DlqError as exc:
            dlq_counts, errors["dlq"] = None, str(exc)
        monitor = self.monitor()
        overview = Overview(
            report=monitor.last_report if monitor else None,
            history=monitor.history if monitor else OffsetHistory(),
            dlq_counts=dlq_counts,
            records=counts["counts"] if counts else None,
            record_replicas=counts.get("replicas", ()) if counts else (),
            missing_partitions=counts.get("missing_partitions", ()) if counts else (),
            anomalies=anomalies["anomalies"] if anomalies else (),
            errors=errors,
            time_to_code=times,
            objectives=self.objectives,
            workers=workers,
        )
        return web.Response(text=overview_html(overview, user), content_type="text/html")

    async def review(self, request: web.Request, user: str) -> web.StreamResponse:
        """``GET /review?applicant=&level=&waiting=&after=``."""
        query = WorkbenchQuery.from_mapping(request.query)
        return await self._workbench(user, query, flash=request.query.get("done", ""))

    async def _workbench(
        self, user: str, query: WorkbenchQuery, *, flash: str = "", error: str = "", status: int = 200
    ) -> web.Response:
        errors: dict[str, str] = {}
        path = query.tasks_path(self.partner.tasks, time.time_ns() // 1_000_000)
        listing = await self._peer("review", path, errors)
        error = "; ".join(filter(None, [error, errors.get("review", "")]))
        text = workbench_html(listing, self.tokens.issue(user), user, query, flash=flash, error=error)
        return web.Response(text=text, status=status, content_type="text/html")

    async def decide(self, request: web.Request, user: str) -> web.StreamResponse:
        """``POST /review/{id}/decision``: form fields decision, final_level, reason, form_token."""
        form = await request.post()
        back = form.get("back")
        query = WorkbenchQuery.from_query_string(back if isinstance(back, str) else "")
        token = form.get("form_token")
        if not self.tokens.valid(user, token if isinstance(token, str) else None):
            refusal = "form expired or not from this console; reload the page and try again"
            return await self._workbench(user, query, error=refusal, status=403)
        record_id = int(request.match_info["avcc_record_id"])
        body = {
            "decision": str(form.get("decision") or ""),
            "final_level": str(form.get("final_level") or ""),
            "reviewer": user,
            "reason": str(form.get("reason") or "").strip(),
        }
        try:
            status, answer = await self.peers.call(
                "review", "POST", self.partner.decide.format(avcc_record_id=record_id), body
            )
        except PeerError as exc:
            return await self._workbench(user, query, error=str(exc), status=502)
        if status != 202:
            message = answer.get("error", str(answer)) if isinstance(answer, dict) else str(answer)
            return await self._workbench(user, query, error=f"record {record_id}: {message}", status=409)
        log.info("operator %s decided %s on record %s", user, body["decision"], record_id)
        done = f"{_PAST.get(body['decision'], body['decision'])} record {record_id}"
        return web.Response(status=303, headers={"Location": query.link(after=query.after, done=done)})

    def routes(self) -> list[tuple[str, str, dict[str, Handler]]]:
        """``(name, path, {method: handler})`` of the console's own routes."""
        g = self.dlq.guarded
        return [
            ("console_home", ROUTE_HOME, {"GET": g(ROUTE_HOME, self.home)}),
            ("console_review", ROUTE_REVIEW, {"GET": g(ROUTE_REVIEW, self.review)}),
            ("console_decide", ROUTE_DECIDE, {"POST": g(ROUTE_DECIDE, self.decide)}),
        ]


def install_home(
    app: faust.App, dlq: DlqConsole, monitor: Callable[[], LagMonitor | None], routes: PartnerRoutes
) -> ConsoleHome:
    """Add the overview and workbench views to the ops group's App (once, at import time); they
    call the other groups at ``routes``."""
    home = ConsoleHome(dlq, monitor, routes)
    for name, path, handlers in home.routes():
        app.page(path, name=name)(faust_view(name, handlers))
    return home
