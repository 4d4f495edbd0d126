"""DLQ console: server-rendered operator pages and a JSON API over the ops worker's DLQ store.

Routes (every one behind the operator login of :mod:`app.platform.http.operators`):

=========================  ======  ==========================================================
``/dlq``                   GET     list with a filter form (topic, group, error class, status,
                                   time range) and a bulk re-inject form
``/dlq.json``              GET     the same list as JSON (``avcc dlq list``)
``/dlq/{id}``              GET     one dead letter: metadata, headers, payload, stack trace, audit
``/dlq/{id}.json``         GET     the same as JSON (``avcc dlq show``)
``/dlq/{id}/reinject``     POST    re-inject into the original topic (form: redirect back; JSON)
``/dlq/{id}/discard``      POST    discard with a reason
``/dlq/bulk-reinject``     POST    re-inject every ``new`` message matching filters
=========================  ======  ==========================================================

POSTs answer JSON when the request is JSON (``Content-Type`` or ``Accept``), else redirect (303)
to the page showing the result. Cross-site POSTs (``Origin`` / ``Sec-Fetch-Site``) are refused,
so a logged-in browser cannot be driven by another site. Pages are registered on the ops group's
faust App with :func:`install_console` (faust's aiohttp web driver, views run on the worker loop);
:func:`console_application` builds a plain aiohttp application of the same routes.
The HTML itself is rendered by :mod:`app.ops.dlq.pages`.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import faust
import orjson
from aiohttp import web

from app.ops.dlq.entries import DlqError, DlqNotFound
from app.ops.dlq.filters import DlqFilter
from app.ops.dlq.journal import StateNotCaughtUp
from app.ops.dlq.pages import (
    LIST_LIMIT,
    ROUTE_BULK,
    ROUTE_DETAIL,
    ROUTE_DETAIL_JSON,
    ROUTE_DISCARD,
    ROUTE_LIST,
    ROUTE_LIST_JSON,
    ROUTE_REINJECT,
    bulk_html,
    detail_html,
    list_html,
    page,
)
from app.ops.dlq.service import DlqService, install_dlq
from app.ops.dlq.store import DlqStore
from app.platform.groups import group_spec
from app.platform.http.headers import security_headers
from app.platform.http.operators import OperatorGuard
from app.platform.http.responses import json_error
from app.platform.settings import Settings, get_settings

__all__ = [
    "DlqConsole",
    "Handler",
    "console_application",
    "console_base_url",
    "faust_view",
    "install_console",
]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_e = html.escape


def console_base_url(settings: Settings) -> str:
    """Where the ops worker serves the console (``web_host``, ``web_port`` + the ops offset)."""
    host = settings.web_host if settings.web_host not in {"0.0.0.0", "::", ""} else "127.0.0.1"
    return f"http://{host}:{settings.web_port + group_spec('ops').port_offset}"


def _wants_json(request: web.Request) -> bool:
    if request.content_type == "application/json":
        return True
    accept = request.headers.get("Accept", "")
    return "application/json" in accept and "text/html" not in accept


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS),
        status=status,
        content_type="application/json",
    )


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _text_field(body: Mapping[str, Any], name: str) -> str | None:
    """The text field ``name`` of a form or JSON body (``ValueError`` - a 400 - when it is
    there but not text, e.g. ``{"operator": 1}`` or a file upload)."""
    value = body.get(name)
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{name}: must be a string")


def _cross_site(request: web.Request) -> bool:
    """A browser POST that did not come from a page of this console."""
    if request.headers.get("Sec-Fetch-Site", "") in {"cross-site", "same-site"}:
        return True
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc.lower() != request.host.lower()


class DlqConsole:
    """Request handlers of the console over a :class:`DlqService` (or a bare :class:`DlqStore`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        service: DlqService | None = None,
        store: DlqStore | None = None,
        guard: OperatorGuard | None = None,
    ) -> None:
        if service is None and store is None:
            raise ValueError("DlqConsole needs a DlqService or a DlqStore")
        self.settings = settings
        self.service = service
        self._fixed_store = store
        self.guard = guard if guard is not None else OperatorGuard.from_settings(settings)

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def store(self) -> DlqStore:
        """The store (raises :class:`DlqError` while the ops worker is starting)."""
        if self._fixed_store is not None:
            return self._fixed_store
        assert self.service is not None
        return self.service.store

    def readiness(self) -> tuple[bool, str]:
        """``/ready`` condition of the console's ops worker (see :meth:`DlqService.readiness`)."""
        return self.service.readiness() if self.service is not None else (True, "")

    def guarded(
        self, route: str, handler: Callable[[web.Request, str], Awaitable[web.StreamResponse]]
    ) -> Handler:
        """Wrap ``handler`` with authentication, the cross-site check and error mapping (the
        worker's middleware counts the answers)."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            return await self._guarded_call(request, handler)

        return wrapped

    async def _guarded_call(
        self, request: web.Request, handler: Callable[[web.Request, str], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        user = self.guard.check(request)
        if isinstance(user, web.Response):
            return user
        if request.method == "POST" and _cross_site(request):
            return self._error(request, 403, "cross-site request refused", "cross_site")
        try:
            return await handler(request, user)
        except DlqNotFound as exc:
            return self._error(request, 404, str(exc), "not_found")
        except ValueError as exc:
            return self._error(request, 400, str(exc), "bad_request")
        except StateNotCaughtUp as exc:
            return self._error(request, 503, str(exc), "not_caught_up")
        except DlqError as exc:
            if "not open yet" in str(exc):
                return self._error(request, 503, str(exc), "unavailable")
            return self._error(request, 409, str(exc), "refused")

    def _error(self, request: web.Request, status: int, message: str, reason: str) -> web.Response:
        if _wants_json(request) or request.path.endswith(".json"):
            return json_error(status, message, reason=reason)
        body = f'<p class="flash error">{_e(message)}</p><p><a href="{ROUTE_LIST}">Back to the list</a></p>'
        return web.Response(text=page(f"Error {status}", body), status=status, content_type="text/html")

    @staticmethod
    def _who(user: str, body: Mapping[str, Any]) -> str:
        claimed = (_text_field(body, "operator") or "").strip()[:100]
        if not claimed or claimed == user:
            return user
        return f"{claimed} (via {user})"

    @staticmethod
    async def _body(request: web.Request) -> Mapping[str, Any]:
        if request.content_type == "application/json":
            raw = await request.read()
            if not raw:
                return {}
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"body: malformed JSON ({exc})") from exc
            if not isinstance(data, dict):
                raise ValueError("body: must be a JSON object")
            return data
        return await request.post()

    # -- handlers ------------------------------------------------------------------------------
    async def list_page(self, request: web.Request, user: str) -> web.StreamResponse:
        """``GET /dlq``."""
        filters = DlqFilter.from_mapping(request.query)
        store = self.store
        entries = store.list(filters, limit=LIST_LIMIT)
        return web.Response(
            text=list_html(entries, filters, request.query, store.counts(), store.facets(), user),
            content_type="text/html",
        )

    async def list_json(self, request: web.Request, user: str) -> web.StreamResponse:
        """``GET /dlq.json``."""
        filters = DlqFilter.from_mapping(request.query)
        limit = int(request.query.get("limit", "1000"))
        entries = self.store.list(filters, limit=limit)
        return _json(
            {
                "filters": filters.as_dict(),
                "counts": self.store.counts(),
                "items": [e.summary() for e in entries],
            }
        )

    async def detail_page(self, request: web.Request, user: str) -> web.StreamResponse:
        """``GET /dlq/{id}``."""
        entry = self.store.get(request.match_info["dlq_id"])
        flash = request.query.get("done")
        return web.Response(
            text=detail_html(
                entry, self.store.reinjections_of(entry), self.store.max_reinjections, flash=flash, user=user
            ),
            content_type="text/html",
        )

    async def detail_json(self, request: web.Request, user: str) -> web.StreamResponse:
        """``GET /dlq/{id}.json``."""
        entry = self.store.get(request.match_info["dlq_id"])
        return _json(
            {
                **entry.detail(),
                "reinjections": self.store.reinjections_of(entry),
                "max_reinjections": self.store.max_reinjections,
            }
        )

    async def reinject(self, request: web.Request, user: str) -> web.StreamResponse:
        """``POST /dlq/{id}/reinject``."""
        dlq_id = request.match_info["dlq_id"]
        body = await self._body(request)
        who = self._who(user, body)
        reason = (_text_field(body, "reason") or "").strip() or None
        try:
            entry = await self.store.reinject(dlq_id, who, reason=reason)
        except DlqError as exc:
            if _wants_json(request) or isinstance(exc, DlqNotFound) or "not open yet" in str(exc):
                raise
            return self._refused(dlq_id, exc, user)
        if _wants_json(request):
            return _json(entry.summary())
        return _redirect(f"/dlq/{dlq_id}?done=reinjected")

    def _refused(self, dlq_id: str, exc: Exception, user: str) -> web.Response:
        """The detail page with the refusal (409) of an operator action."""
        current = self.store.get(dlq_id)
        text = detail_html(
            current,
            self.store.reinjections_of(current),
            self.store.max_reinjections,
            error=str(exc),
            user=user,
        )
        return web.Response(text=text, status=409, content_type="text/html")

    async def discard(self, request: web.Request, user: str) -> web.StreamResponse:
        """``POST /dlq/{id}/discard``."""
        dlq_id = request.match_info["dlq_id"]
        body = await self._body(request)
        who = self._who(user, body)
        try:
            entry = await self.store.discard(dlq_id, who, _text_field(body, "reason") or "")
        except DlqError as exc:
            if _wants_json(request) or isinstance(exc, DlqNotFound):
                raise
            return self._refused(dlq_id, exc, user)
        if _wants_json(request):
            return _json(entry.summary())
        return _redirect(f"/dlq/{dlq_id}?done=discarded")

    async def bulk_reinject(self, request: web.Request, user: str) -> web.StreamResponse:
        """``POST /dlq/bulk-reinject``: every ``new`` match of the filters in the body."""
        body = await self._body(request)
        filters = DlqFilter.from_mapping(body)
        if not filters.as_dict():
            raise ValueError("give at least one filter (topic, group, error_class, since, until)")
        if not _wants_json(request) and body.get("confirm") != "yes":
            raise ValueError("tick the confirmation box to re-inject in bulk")
        who = self._who(user, body)
        result = await self.store.bulk_reinject(filters, who, reason=_text_field(body, "reason") or None)
        if _wants_json(request):
            return _json({**result.as_dict(), "filters": filters.as_dict()})
        return web.Response(
            text=bulk_html(result.reinjected, result.refused, filters), content_type="text/html"
        )

    def routes(self) -> list[tuple[str, str, dict[str, Handler]]]:
        """``(name, path, {method: handler})`` of every console route (specific ones first)."""
        g = self.guarded
        return [
            ("dlq_list_json", ROUTE_LIST_JSON, {"GET": g(ROUTE_LIST_JSON, self.list_json)}),
            ("dlq_list", ROUTE_LIST, {"GET": g(ROUTE_LIST, self.list_page)}),
            ("dlq_bulk", ROUTE_BULK, {"POST": g(ROUTE_BULK, self.bulk_reinject)}),
            ("dlq_detail_json", ROUTE_DETAIL_JSON, {"GET": g(ROUTE_DETAIL_JSON, self.detail_json)}),
            ("dlq_reinject", ROUTE_REINJECT, {"POST": g(ROUTE_REINJECT, self.reinject)}),
            ("dlq_discard", ROUTE_DISCARD, {"POST": g(ROUTE_DISCARD, self.discard)}),
            ("dlq_detail", ROUTE_DETAIL, {"GET": g(ROUTE_DETAIL, self.detail_page)}),
        ]


def faust_view(name: str, handlers: Mapping[str, Handler]) -> type[Any]:
    """A faust ``View`` class delegating the given methods to aiohttp handlers."""
    attrs: dict[str, Any] = {"__doc__": f"DLQ console view {name}."}
    for method, handler in handlers.items():

        def bind(h: Handler) -> Callable[..., Awaitable[web.StreamResponse]]:
            async def call(self: Any, request: web.Request, **_: Any) -> web.StreamResponse:
                return await h(request)

            return call

        attrs[method.lower()] = bind(handler)
    return type(f"DlqConsole_{name}", (faust.web.View,), attrs)


def install_console(
    app: faust.App, settings: Settings | None = None, *, service: DlqService | None = None
) -> DlqConsole:
    """Add the DLQ console to the ops group's App: the :class:`DlqService` (store, DLQ consumer,
    alerts, re-injection producer) and the web views, served by the worker's web server.

    Call it once at import time of the ops module (before the worker starts).
    """
    settings = settings or get_settings()
    if getattr(app, "_web_server_service", None) is not None:
        log.warning("app %s has a custom web server: mount console_application() there", app.conf.id)
    service = service or install_dlq(app, settings, console_url=console_base_url(settings))
    console = DlqConsole(settings, service=service, guard=getattr(app, "operator_guard", None))
    for name, path, handlers in console.routes():
        app.page(path, name=name)(faust_view(name, handlers))
    return console


def console_application(console: DlqConsole) -> web.Application:
    """A plain aiohttp application serving the console (tests, custom web servers)."""
    application = web.Application(middlewares=[security_headers])
    for _name, path, handlers in console.routes():
        for method, handler in handlers.items():
            application.router.add_route(method, path, handler)
    return application
