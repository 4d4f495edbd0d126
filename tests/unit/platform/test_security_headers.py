"""Security headers on every answer of a worker's web server (clickjacking, MIME sniffing)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.platform.http.headers import SECURITY_HEADERS, security_headers
from app.platform.http.operators import OperatorGuard, operator_login

Client = TestClient[web.Request, web.Application]


async def _html(request: web.Request) -> web.Response:
    return web.Response(text="<form method=post><button>re-inject</button></form>", content_type="text/html")


async def _json(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _raises(request: web.Request) -> web.Response:
    raise web.HTTPBadRequest(text="no")


async def _own_policy(request: web.Request) -> web.Response:
    return web.Response(text="x", headers={"X-Frame-Options": "SAMEORIGIN"})


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    guard = OperatorGuard({"admin": "admin"})
    app = web.Application(middlewares=[security_headers, operator_login(guard)])
    app.router.add_get("/dlq", _html)
    app.router.add_get("/v1/x", _json)
    app.router.add_get("/v1/raises", _raises)
    app.router.add_get("/v1/own", _own_policy)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


def _assert_secured(response: web.StreamResponse | object) -> None:
    headers = response.headers  # type: ignore[attr-defined]
    assert headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none' covers scripts
    assert headers["X-Content-Type-Options"] == "nosniff"


async def test_every_answer_forbids_framing_and_sniffing(client: Client) -> None:
    for path, status in (("/dlq", 401), ("/v1/x", 200), ("/v1/raises", 400), ("/nowhere", 404)):
        response = await client.get(path)
        assert response.status == status, path
        _assert_secured(response)
    page = await client.get("/dlq", headers={"Authorization": "Basic YWRtaW46YWRtaW4="})
    assert page.status == 200 and page.content_type == "text/html"
    _assert_secured(page)


async def test_a_views_own_header_is_kept(client: Client) -> None:
    response = await client.get("/v1/own")
    assert response.headers["X-Frame-Options"] == "SAMEORIGIN"
    assert response.headers["X-Content-Type-Options"] == SECURITY_HEADERS["X-Content-Type-Options"]


def test_the_faust_apps_install_the_middlewares() -> None:
    from app.platform.faust.app import get_app
    from app.platform.http.counting import count_requests

    app = get_app("code")
    middlewares = app.conf.web_application_options["middlewares"]
    assert middlewares[:2] == [count_requests, security_headers]
    assert len(middlewares) == 3 and app.operator_guard is not None  # type: ignore[attr-defined]


def test_the_lag_pages_policy_adds_same_origin_scripts_only() -> None:
    """The lag page's live script comes from the worker itself; nothing inline, no other origin,
    and framing stays refused."""
    from app.platform.http.headers import CONTENT_SECURITY_POLICY, LIVE_PAGE_POLICY

    directives = dict(d.strip().split(" ", 1) for d in LIVE_PAGE_POLICY.split(";"))
    assert directives["script-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["default-src"] == "'none'"
    assert "unsafe-inline" not in directives["script-src"] and "unsafe-eval" not in LIVE_PAGE_POLICY
    others = {k: v for k, v in directives.items() if k not in {"script-src", "connect-src"}}
    assert others == dict(d.strip().split(" ", 1) for d in CONTENT_SECURITY_POLICY.split(";"))
