"""DLQ console: server-rendered operator pages and a JSON API over the ops worker's DLQ store.

Routes (every one behind HTTP Basic authentication against ``settings.effective_operators()``):

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
"""

from __future__ import annotations

import hmac
import html
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import faust
import orjson
from aiohttp import BasicAuth, web

from app.ops.dlq.store import (
    MAX_REINJECTIONS,
    STATUSES,
    DlqEntry,
    DlqError,
    DlqFilter,
    DlqNotFound,
    DlqService,
    DlqStore,
    install_dlq,
    iso_ms,
)
from app.platform.groups import group_spec
from app.platform.settings import Settings, get_settings

__all__ = [
    "ROUTE_BULK",
    "ROUTE_DETAIL",
    "ROUTE_DETAIL_JSON",
    "ROUTE_DISCARD",
    "ROUTE_LIST",
    "ROUTE_LIST_JSON",
    "ROUTE_REINJECT",
    "DlqConsole",
    "console_application",
    "console_base_url",
    "install_console",
]

log = logging.getLogger(__name__)

_ID = r"{dlq_id:\d+-\d+(?:-\d+)?}"
ROUTE_LIST = "/dlq"
ROUTE_LIST_JSON = "/dlq.json"
ROUTE_BULK = "/dlq/bulk-reinject"
ROUTE_DETAIL = f"/dlq/{_ID}"
ROUTE_DETAIL_JSON = f"/dlq/{_ID}.json"
ROUTE_REINJECT = f"/dlq/{_ID}/reinject"
ROUTE_DISCARD = f"/dlq/{_ID}/discard"

REALM = "AVCC DLQ console"
LIST_LIMIT = 500

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
    ) -> None:
        if service is None and store is None:
            raise ValueError("DlqConsole needs a DlqService or a DlqStore")
        self.settings = settings
        self.service = service
        self._fixed_store = store
        self.operators = settings.effective_operators()

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def store(self) -> DlqStore:
        """The store (raises :class:`DlqError` while the ops worker is starting)."""
        if self._fixed_store is not None:
            return self._fixed_store
        assert self.service is not None
        return self.service.store

    def authenticate(self, request: web.Request) -> str | None:
        """The operator name if the request carries valid Basic credentials."""
        header = request.headers.get("Authorization", "")
        if not header.lower().startswith("basic "):
            return None
        try:
            creds = BasicAuth.decode(header)
        except ValueError:
            return None
        expected = self.operators.get(creds.login)
        ok = hmac.compare_digest(
            (expected if expected is not None else "\x00invalid\x00").encode(), creds.password.encode()
        )
        return creds.login if ok and expected is not None else None

    def _unauthorized(self) -> web.Response:
        message = "operator login required"
        if not self.operators:
            message += " (no operator logins configured: set AVCC_OPERATOR_USERS)"
        return web.Response(
            status=401,
            text=message + "\n",
            headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
        )

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
        user = self.authenticate(request)
        if user is None:
            return self._unauthorized()
        if request.method == "POST" and _cross_site(request):
            return self._error(request, 403, "cross-site request refused")
        try:
            return await handler(request, user)
        except DlqNotFound as exc:
            return self._error(request, 404, str(exc))
        except ValueError as exc:
            return self._error(request, 400, str(exc))
        except DlqError as exc:
            status = 503 if "not open yet" in str(exc) else 409
            return self._error(request, status, str(exc))

    def _error(self, request: web.Request, status: int, message: str) -> web.Response:
        if _wants_json(request) or request.path.endswith(".json"):
            return _json({"error": message}, status)
        body = f'<p class="flash error">{_e(message)}</p><p><a href="{ROUTE_LIST}">Back to the list</a></p>'
        return web.Response(text=_page(f"Error {status}", body), status=status, content_type="text/html")

    @staticmethod
    def _who(user: str, claimed: str | None) -> str:
        claimed = (claimed or "").strip()[:100]
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
            text=_list_html(entries, filters, request.query, store.counts(), store.facets(), user),
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
            text=_detail_html(
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
        who = self._who(user, body.get("operator"))
        reason = str(body.get("reason") or "").strip() or None
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
        page = _detail_html(
            current,
            self.store.reinjections_of(current),
            self.store.max_reinjections,
            error=str(exc),
            user=user,
        )
        return web.Response(text=page, status=409, content_type="text/html")

    async def discard(self, request: web.Request, user: str) -> web.StreamResponse:
        """``POST /dlq/{id}/discard``."""
        dlq_id = request.match_info["dlq_id"]
        body = await self._body(request)
        who = self._who(user, body.get("operator"))
        try:
            entry = self.store.discard(dlq_id, who, str(body.get("reason") or ""))
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
        who = self._who(user, body.get("operator"))
        result = await self.store.bulk_reinject(filters, who, reason=str(body.get("reason") or "") or None)
        if _wants_json(request):
            return _json({**result.as_dict(), "filters": filters.as_dict()})
        return web.Response(
            text=_bulk_html(result.reinjected, result.refused, filters), content_type="text/html"
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


def _faust_view(name: str, handlers: Mapping[str, Handler]) -> type[Any]:
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
    console = DlqConsole(settings, service=service)
    for name, path, handlers in console.routes():
        app.page(path, name=name)(_faust_view(name, handlers))
    return console


def console_application(console: DlqConsole) -> web.Application:
    """A plain aiohttp application serving the console (tests, custom web servers)."""
    application = web.Application()
    for _name, path, handlers in console.routes():
        for method, handler in handlers.items():
            application.router.add_route(method, path, handler)
    return application


# -- HTML ------------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:.7rem 1.5rem;display:flex;justify-content:space-between}
header a{color:#fff;text-decoration:none;font-weight:600}
main{padding:1rem 1.5rem;max-width:1400px}
table{border-collapse:collapse;width:100%;background:#fff;font-size:.9rem}
th,td{border-bottom:1px solid #e2e5ea;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#eef0f3}
pre{background:#fff;border:1px solid #e2e5ea;padding:.7rem;overflow:auto;max-height:30rem;font-size:.85rem}
form.filters{display:flex;flex-wrap:wrap;gap:.5rem;align-items:end;margin-bottom:1rem}
form.filters label{display:flex;flex-direction:column;font-size:.8rem}
.status{padding:.1rem .45rem;border-radius:.6rem;font-size:.8rem;font-weight:600}
.status-new{background:#fde2e1;color:#9b1c1c}
.status-reinjected{background:#def7ec;color:#03543f}
.status-discarded{background:#e5e7eb;color:#374151}
.flash{padding:.6rem .8rem;border-radius:.3rem;background:#def7ec}
.flash.error{background:#fde2e1}
.actions{display:flex;gap:2rem;flex-wrap:wrap;margin:1rem 0}
.actions form{background:#fff;border:1px solid #e2e5ea;padding:.7rem}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}
dl.meta dt{font-weight:600}
dl.meta dd{margin:0;word-break:break-all}
.muted{color:#6b7280}
"""


def _page(title: str, body: str, user: str | None = None) -> str:
    who = f'<span class="muted">operator: {_e(user)}</span>' if user else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)} · AVCC DLQ</title><style>{_CSS}</style></head><body>"
        f'<header><a href="{ROUTE_LIST}">AVCC dead-letter queue</a>{who}</header>'
        f"<main><h1>{_e(title)}</h1>{body}</main></body></html>"
    )


def _status(status: str) -> str:
    return f'<span class="status status-{_e(status)}" data-status="{_e(status)}">{_e(status)}</span>'


def _input(name: str, label: str, value: str, options: Iterable[str] = (), kind: str = "text") -> str:
    datalist = ""
    attrs = ""
    options = list(options)
    if options:
        datalist = f'<datalist id="dl-{name}">' + "".join(f'<option value="{_e(o)}">' for o in options)
        datalist += "</datalist>"
        attrs = f' list="dl-{name}"'
    return (
        f'<label>{_e(label)}<input type="{kind}" name="{name}" value="{_e(value)}"{attrs}></label>{datalist}'
    )


def _list_html(
    entries: list[DlqEntry],
    filters: DlqFilter,
    query: Mapping[str, str],
    counts: Mapping[str, int],
    facets: Mapping[str, list[str]],
    user: str,
) -> str:
    q = {k: query.get(k, "") for k in ("topic", "group", "error_class", "status", "since", "until")}
    status_options = "".join(
        f'<option value="{s}"{" selected" if q["status"] == s else ""}>{s}</option>' for s in ("", *STATUSES)
    )
    form = (
        f'<form class="filters" method="get" action="{ROUTE_LIST}">'
        + _input("topic", "Topic", q["topic"], facets.get("topic", ()))
        + _input("group", "Group", q["group"], facets.get("group", ()))
        + _input("error_class", "Error class", q["error_class"], facets.get("error_class", ()))
        + f'<label>Status<select name="status">{status_options}</select></label>'
        + _input("since", "Failed since (UTC)", q["since"], kind="datetime-local")
        + _input("until", "Failed until (UTC)", q["until"], kind="datetime-local")
        + '<button type="submit">Filter</button>'
        + f'<a href="{ROUTE_LIST}">reset</a></form>'
    )
    totals = ", ".join(f"{_e(k)}: {v}" for k, v in counts.items())
    rows = []
    for e in entries:
        s = e.summary()
        rows.append(
            "<tr>"
            f'<td><a class="dlq-link" href="/dlq/{_e(e.dlq_id)}">{_e(e.dlq_id)}</a></td>'
            f"<td>{_status(e.status)}</td>"
            f"<td>{_e(s['failed_at'])}</td>"
            f"<td>{_e(e.original_topic)}</td>"
            f"<td>{_e(e.consumer_group)}</td>"
            f'<td title="{_e(e.error_class)}">{_e(e.error_class.rsplit(".", 1)[-1])}</td>'
            f"<td>{_e(s['error_message'][:120])}</td>"
            f"<td>{_e(e.event_id or '')}</td>"
            f"<td>{_e(str(s['attempt'] or ''))}</td>"
            f"<td>{e.reinjected_count}</td>"
            "</tr>"
        )
    table = (
        '<table id="dlq-table"><thead><tr><th>id</th><th>status</th><th>failed at (UTC)</th><th>topic</th>'
        "<th>group</th><th>error</th><th>message</th><th>event id</th><th>attempts</th>"
        "<th>re-injected</th></tr></thead><tbody>"
        + ("".join(rows) or '<tr><td colspan="10" class="muted">no dead letters match</td></tr>')
        + "</tbody></table>"
    )
    bulk = ""
    active = {k: v for k, v in q.items() if v and k != "status"}
    if active:
        hidden = "".join(f'<input type="hidden" name="{_e(k)}" value="{_e(v)}">' for k, v in active.items())
        new_count = sum(1 for e in entries if e.status == "new")
        bulk = (
            f'<div class="actions"><form method="post" action="{ROUTE_BULK}">{hidden}'
            f"<strong>Bulk re-inject</strong> the new messages matching "
            f"{_e(', '.join(f'{k}={v}' for k, v in active.items()))} ({new_count} shown) "
            '<label><input type="checkbox" name="confirm" value="yes" required> confirm</label> '
            '<input type="text" name="reason" placeholder="reason (optional)"> '
            '<button type="submit">Re-inject all</button></form></div>'
        )
    shown = f"{len(entries)} shown" + (f" (first {LIST_LIMIT})" if len(entries) >= LIST_LIMIT else "")
    body = form + f'<p class="muted">{shown}. Totals: {totals}.</p>' + bulk + table
    return _page("Dead letters", body, user)


def _dl(items: Iterable[tuple[str, str]]) -> str:
    return '<dl class="meta">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items) + "</dl>"


def _detail_html(
    entry: DlqEntry,
    reinjections: int,
    max_reinjections: int = MAX_REINJECTIONS,
    *,
    flash: str | None = None,
    error: str | None = None,
    user: str | None = None,
) -> str:
    meta = entry.metadata
    d = entry.detail()
    parts: list[str] = []
    if flash in {"reinjected", "discarded"}:
        parts.append(f'<p class="flash" id="flash">Message {_e(flash)}.</p>')
    if error:
        parts.append(f'<p class="flash error" id="error">{_e(error)}</p>')
    parts.append(f'<p>Status: <strong id="status">{_status(entry.status)}</strong></p>')
    left = max(0, max_reinjections - reinjections)
    reinject_disabled = " disabled" if left == 0 or meta is None else ""
    discard_form = ""
    if entry.status == "new":
        discard_form = (
            f'<form method="post" action="/dlq/{_e(entry.dlq_id)}/discard">'
            '<input type="text" name="reason" placeholder="reason (required)" required> '
            '<button type="submit" id="discard">Discard</button></form>'
        )
    parts.append(
        '<div class="actions">'
        f'<form method="post" action="/dlq/{_e(entry.dlq_id)}/reinject">'
        '<input type="text" name="reason" placeholder="note (optional)"> '
        f'<button type="submit" id="reinject"{reinject_disabled}>Re-inject</button> '
        f'<span class="muted">into {_e(entry.original_topic or "?")}; {left} of {max_reinjections} '
        "re-injections left</span></form>"
        f"{discard_form}</div>"
    )
    summary = [
        ("original topic", entry.original_topic),
        (
            "original partition / offset",
            f"{meta.original_partition} / {meta.original_offset}" if meta else "",
        ),
        ("consumer group", entry.consumer_group),
        ("error class", entry.error_class),
        ("error message", meta.error_message if meta else (entry.metadata_error or "")),
        ("event id", entry.event_id or ""),
        (
            "key",
            d["key"]
            if d["key"] is not None
            else ("(none)" if entry.key is None else f"base64:{d['key_b64']}"),
        ),
        ("attempts", str(meta.attempt) if meta else ""),
        ("first failure (UTC)", iso_ms(meta.first_failure_ms) if meta else ""),
        ("dead-lettered (UTC)", iso_ms(entry.failed_at_ms)),
        ("original timestamp (UTC)", iso_ms(meta.original_timestamp_ms) if meta else ""),
        ("DLQ position", f"partition {entry.partition}, offset {entry.offset}"),
        ("re-injected", f"{entry.reinjected_count} time(s) from this entry; {reinjections} for the event"),
    ]
    parts.append("<h2>Failure</h2>" + _dl(summary))
    if entry.metadata_error:
        parts.append(f'<p class="flash error">Failure metadata unusable: {_e(entry.metadata_error)}</p>')
    header_rows = "".join(
        f"<tr><td>{_e(h['name'])}</td><td>{_header_text(h)}</td></tr>" for h in d["headers"]
    )
    parts.append(
        "<h2>Headers</h2><table><thead><tr><th>name</th><th>value</th></tr></thead><tbody>"
        + (header_rows or '<tr><td colspan="2" class="muted">none</td></tr>')
        + "</tbody></table>"
    )
    parts.append(
        f'<h2>Payload <span class="muted">({_e(d["payload_kind"])})</span></h2>'
        f'<pre id="payload">{_e(d["payload"])}</pre>'
    )
    if d["stacktrace"]:
        parts.append(f'<h2>Stack trace</h2><pre id="stacktrace">{_e(d["stacktrace"])}</pre>')
    audit_rows = "".join(
        f"<tr><td>{_e(a['at'])}</td><td>{_e(a['who'])}</td><td>{_e(a['action'])}</td>"
        f"<td>{_e(a['reason'] or '')}</td><td>{_e(a['detail'] or '')}</td></tr>"
        for a in d["audit"]
    )
    parts.append(
        '<h2>Audit trail</h2><table id="audit"><thead><tr><th>when (UTC)</th><th>who</th><th>action</th>'
        "<th>reason</th><th>detail</th></tr></thead><tbody>"
        + (audit_rows or '<tr><td colspan="5" class="muted">no actions yet</td></tr>')
        + "</tbody></table>"
    )
    return _page(f"Dead letter {entry.dlq_id}", "".join(parts), user)


def _header_text(header: Mapping[str, Any]) -> str:
    if header["value"] is not None:
        return _e(header["value"])
    return "base64:" + _e(header["value_b64"])


def _bulk_html(reinjected: list[str], refused: Mapping[str, str], filters: DlqFilter) -> str:
    kept = {k: v for k, v in filters.as_dict().items() if k in ("topic", "group", "error_class")}
    back = f"{ROUTE_LIST}?{urlencode(kept)}"
    items = "".join(f'<li><a href="/dlq/{_e(i)}">{_e(i)}</a></li>' for i in reinjected)
    refused_items = "".join(
        f'<li><a href="/dlq/{_e(i)}">{_e(i)}</a>: {_e(m)}</li>' for i, m in refused.items()
    )
    body = (
        f'<p class="flash" id="flash">Re-injected {len(reinjected)} message(s); refused {len(refused)}.</p>'
        f"<ul>{items}</ul>"
        + (f"<h2>Refused</h2><ul>{refused_items}</ul>" if refused else "")
        + f'<p><a href="{_e(back)}">Back to the list</a></p>'
    )
    return _page("Bulk re-injection", body)
