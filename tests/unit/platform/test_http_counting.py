"""The request-counting middleware: one count per answer, labelled by the registered route."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.platform.http.counting import count_requests
from app.platform.http.peers import PEER_HEADER
from app.platform.http.responses import json_error, json_response
from app.platform.metrics import REGISTRY

DETAIL = r"/items/{item_id:\d+}"


def count(route: str, method: str, status: str) -> float:
    value = REGISTRY.get_sample_value(
        "avcc_http_requests_total", {"route": route, "method": method, "status": status}
    )
    return value or 0.0


async def ok(request: web.Request) -> web.Response:
    return json_response({"ok": True})


async def refused(request: web.Request) -> web.Response:
    return json_error(401, "no", reason="missing_header")


async def too_large(request: web.Request) -> web.Response:
    raise web.HTTPRequestEntityTooLarge(max_size=1, actual_size=2)


async def broken(request: web.Request) -> web.Response:
    raise RuntimeError("bug")


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application(middlewares=[count_requests])
    app.router.add_route("GET", DETAIL, ok)
    app.router.add_route("POST", "/refused", refused)
    app.router.add_route("POST", "/large", too_large)
    app.router.add_route("GET", "/broken", broken)
    app.router.add_route("GET", "/metrics", ok)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_counts_by_registered_route_template(client: TestClient[web.Request, web.Application]) -> None:
    before = count(DETAIL, "GET", "200")
    for item in (1, 2):
        assert (await client.get(f"/items/{item}")).status == 200
    assert count(DETAIL, "GET", "200") == before + 2


async def test_counts_refusals_and_failures(client: TestClient[web.Request, web.Application]) -> None:
    labels = [("/refused", "POST", "401"), ("/large", "POST", "413"), ("/broken", "GET", "500")]
    before = [count(*label) for label in labels]
    assert (await client.post("/refused")).status == 401
    assert (await client.post("/large")).status == 413
    assert (await client.get("/broken")).status == 500
    assert [count(*label) for label in labels] == [b + 1 for b in before]


async def test_skips_probes_unmatched_paths_and_peer_forwards(
    client: TestClient[web.Request, web.Application],
) -> None:
    before = [count("/metrics", "GET", "200"), count(DETAIL, "GET", "200")]
    assert (await client.get("/metrics")).status == 200
    assert (await client.get("/nowhere")).status == 404
    assert (await client.get("/items/3", headers={PEER_HEADER: "signature"})).status == 200
    assert [count("/metrics", "GET", "200"), count(DETAIL, "GET", "200")] == before
