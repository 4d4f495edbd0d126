"""Bad input answers 4xx, never 500, and open answers carry no exception text (issue 9)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.platform.faust.readiness import WorkerState, readiness
from app.platform.http.auth import sign_request
from app.platform.http.routing import OwnerRouting, RecordRequest
from app.platform.settings import Settings

Client = TestClient[web.Request, web.Application]
SETTINGS = Settings(hmac_keys={"partner": "partner-secret"}, dev_mode=False)


async def _record(request: web.Request) -> web.Response:
    owners = OwnerRouting(SimpleNamespace(), SimpleNamespace(), SETTINGS)
    parsed = await owners.record_request(request, request.match_info["avcc_record_id"], scope="records:read")
    if isinstance(parsed, web.Response):
        return parsed
    assert isinstance(parsed, RecordRequest)
    return web.json_response({"record_id": parsed.record_id})


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    app = web.Application()
    app.router.add_get("/v1/avcc/records/{avcc_record_id}", _record)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def _signed_get(client: Client, raw_id: str) -> tuple[int, Any]:
    """GET the record ``raw_id`` (percent-encoded as sent, and as signed)."""
    headers = sign_request("GET", f"/v1/avcc/records/{raw_id}", b"", "partner", "partner-secret")
    response = await client.get(f"/v1/avcc/records/{raw_id}", headers=headers)
    return response.status, await response.json()


@pytest.mark.parametrize(
    "raw_id",
    [
        "%C2%B2",  # "²".isdigit() is true, int("²") raises
        "%D9%A3",  # an Arabic-Indic digit: int() would accept it as 3
        "1" * 20,
        "1" * 5000,  # past Python's int() digit limit
        "-1",
    ],
)
async def test_signed_record_request_with_a_bad_id_is_a_400(client: Client, raw_id: str) -> None:
    status, body = await _signed_get(client, raw_id)
    assert status == 400, body
    assert body["error"] == "avcc_record_id: must be a decimal integer"


async def test_signed_record_request_with_a_good_id(client: Client) -> None:
    assert await _signed_get(client, "10042") == (200, {"record_id": 10042})


def test_ready_body_has_no_exception_text() -> None:
    def assignment() -> list[tuple[str, int]]:
        raise RuntimeError("clickhouse://ops:hunter2@ch-internal-7:9000 refused")

    app = SimpleNamespace(crashed=False, agents={}, tables={})
    state = WorkerState("sink", consumer=False, started=True, assignment=assignment)
    ok, body = readiness(app, state)  # type: ignore[arg-type]
    assert not ok
    assert body == {"group": "sink", "status": "starting", "reason": "consumer not started"}
