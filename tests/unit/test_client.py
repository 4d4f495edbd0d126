"""The partner client against a local aiohttp server that checks signatures like the workers do.

The server verifies every request with ``app.platform.http.auth.authenticate`` (signature, skew,
nonce reuse) and answers from a script: 429 with ``Retry-After``, partial acceptance, 202.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import pytest
from aiohttp import web

from app.client import QUEUE_FULL, ApiError, AvccClient, DuplicateContent, retry_after_s
from app.platform.http.auth import RequestRefused, authenticate
from app.platform.http.signing import NonceCache
from app.platform.settings import Settings
from app.playback.gateway.ingest import QUEUE_FULL as GATEWAY_QUEUE_FULL

KEY, SECRET = "partner-a", "partner-a-secret"


@dataclass
class Scripted:
    """Answers to give, in order (then 202 accepting everything); what was received, when."""

    answers: list[tuple[int, dict[str, Any] | None, dict[str, str]]] = field(default_factory=list)
    received: list[tuple[float, str, Any]] = field(default_factory=list)


def playback_item(i: int) -> dict[str, Any]:
    return {
        "avcc_code": f"MA.156.10005.8361/AV{i:08d}",
        "platform_node": "8361",
        "user_hash": "sha256:" + hashlib.sha256(f"u{i}".encode()).hexdigest(),
        "event_type": "play",
        "duration_sec": 60,
        "revenue_cny": "0.00",
    }


def _app(script: Scripted) -> web.Application:
    settings = Settings(hmac_keys={KEY: SECRET})
    nonces = NonceCache(ttl_ms=600_000)

    async def handle(request: web.Request) -> web.Response:
        try:
            body = (await authenticate(request, settings, scope="apply", nonces=nonces)).body
        except RequestRefused as exc:
            return exc.response()
        if request.content_type == "application/x-ndjson":
            payload: Any = [json.loads(line) for line in body.split(b"\n")]
        else:
            payload = json.loads(body) if body else None
        script.received.append((time.monotonic(), request.path, payload))
        if script.answers:
            status, answer, headers = script.answers.pop(0)
            return web.json_response(answer, status=status, headers=headers)
        if request.path == "/v1/avcc/applications:batch":
            items = [
                {"index": i, "http_status": 202, "request_id": a["request_id"]} for i, a in enumerate(payload)
            ]
            return web.json_response({"items": items}, status=202)
        if request.path == "/v1/playback/events":
            return web.json_response({"accepted": len(payload), "rejected": 0, "errors": []}, status=202)
        return web.json_response({"request_id": payload["request_id"], "avcc_record_id": 7}, status=202)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@pytest.fixture
def server() -> Iterator[tuple[str, Scripted]]:
    script = Scripted()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app(script))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", script
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_queue_full_text_matches_the_gateway() -> None:
    assert QUEUE_FULL == GATEWAY_QUEUE_FULL


def test_batches_and_honours_retry_after_on_429(server: tuple[str, Scripted]) -> None:
    url, script = server
    script.answers.append((429, {"error": "saturated", "reason": "backpressure"}, {"Retry-After": "1"}))
    client = AvccClient(url, KEY, SECRET)
    report = client.send_playback((playback_item(i) for i in range(25)), batch_size=10)
    assert (report.accepted, report.rejected, report.requests) == (25, [], 4)
    assert [len(p) for _, _, p in script.received] == [10, 10, 10, 5]
    first, again = script.received[0][0], script.received[1][0]
    assert again - first >= 0.95
    assert report.waited_s == 1.0


def test_partial_429_resends_only_the_throttled_items(server: tuple[str, Scripted]) -> None:
    url, script = server
    partial = {
        "accepted": 2,
        "rejected": 3,
        "errors": [
            {"index": 1, "error": "user_hash: must be 'sha256:' followed by 64 lowercase hex digits"},
            {"index": 3, "error": QUEUE_FULL},
            {"index": 4, "error": QUEUE_FULL},
        ],
    }
    script.answers.append((429, partial, {"Retry-After": formatdate(time.time() + 1, usegmt=True)}))
    report = AvccClient(url, KEY, SECRET, playback_url=url).send_playback(
        [playback_item(i) for i in range(5)]
    )
    assert report.accepted == 4
    assert report.rejected == [(1, partial["errors"][0]["error"])]
    assert script.received[1][2] == [playback_item(3), playback_item(4)]


def test_item_errors_keep_their_input_index_across_batches(server: tuple[str, Scripted]) -> None:
    url, script = server
    script.answers.append((202, {"accepted": 3, "rejected": 0, "errors": []}, {}))
    script.answers.append((202, {"accepted": 1, "rejected": 1, "errors": [{"index": 0, "error": "bad"}]}, {}))
    report = AvccClient(url, KEY, SECRET).send_playback([playback_item(i) for i in range(5)], batch_size=3)
    assert report.rejected == [(3, "bad")]


def test_gives_up_after_max_retries(server: tuple[str, Scripted]) -> None:
    url, script = server
    script.answers.extend([(429, {"error": "saturated"}, {"Retry-After": "0"})] * 3)
    waits: list[float] = []
    client = AvccClient(url, KEY, SECRET, max_retries=2, sleep=waits.append)
    with pytest.raises(ApiError) as info:
        client.send_playback([playback_item(0)])
    assert info.value.status == 429
    assert waits == [0.0, 0.0]


def test_apply_retries_503_and_reports_409_and_400(server: tuple[str, Scripted]) -> None:
    url, script = server
    client = AvccClient(url, KEY, SECRET, sleep=lambda _: None)
    script.answers.append((503, {"error": "claim timed out"}, {}))
    receipt = client.apply({"request_id": "req-1", "title": "t"})
    assert receipt == {"request_id": "req-1", "avcc_record_id": 7}
    assert len(script.received) == 2
    script.answers.append((409, {"avcc_record_id": 3, "status": "issued"}, {}))
    with pytest.raises(DuplicateContent) as duplicate:
        client.apply({"request_id": "req-2"})
    assert duplicate.value.body["avcc_record_id"] == 3
    script.answers.append((400, {"error": "priority: must be <= 9", "fields": ["priority"]}, {}))
    with pytest.raises(ApiError, match="priority: must be <= 9") as bad:
        client.apply({"request_id": "req-3"})
    assert bad.value.status == 400


def test_wrong_secret_is_refused_by_the_real_check(server: tuple[str, Scripted]) -> None:
    url, _ = server
    with pytest.raises(ApiError) as info:
        AvccClient(url, KEY, "wrong").send_playback([playback_item(0)])
    assert info.value.status == 401


def test_retry_after_parsing() -> None:
    assert retry_after_s("3") == 3.0
    assert retry_after_s(None) == 1.0
    assert retry_after_s("garbage") == 1.0
    assert 9.0 <= retry_after_s(formatdate(time.time() + 10, usegmt=True)) <= 10.0
    assert retry_after_s(formatdate(time.time() - 10, usegmt=True)) == 0.0


def _app_line(i: int) -> bytes:
    return json.dumps({"request_id": f"r{i}", "title": f"work {i}"}).encode()


def test_batch_resends_only_throttled_items_and_keeps_input_indexes(server: tuple[str, Scripted]) -> None:
    url, script = server
    throttled = {
        "error": "some items were not claimed in time; resend those",
        "items": [
            {"index": 0, "http_status": 202, "request_id": "r0", "avcc_record_id": 1},
            {"index": 1, "http_status": 429, "request_id": "r1"},
            {"index": 2, "http_status": 400, "error": "title: required", "fields": ["title"]},
            {"index": 3, "http_status": 429, "request_id": "r3"},
        ],
    }
    script.answers.append((429, throttled, {"Retry-After": "1"}))
    script.answers.append((429, {"error": "busy", "reason": "busy"}, {"Retry-After": "1"}))
    report = AvccClient(url, KEY, SECRET).apply_batch([_app_line(i) for i in range(4)])
    assert [a["http_status"] for a in report.answers] == [202, 202, 400, 202]
    assert [a["index"] for a in report.answers] == [0, 1, 2, 3]
    assert report.answers[3]["request_id"] == "r3"
    assert (report.requests, report.throttled, report.waited_s) == (3, 2, 2.0)
    sent = [[item["request_id"] for item in p] for _, path, p in script.received]
    assert sent == [["r0", "r1", "r2", "r3"], ["r1", "r3"], ["r1", "r3"]]


def test_batch_gives_up_after_max_retries_without_progress(server: tuple[str, Scripted]) -> None:
    url, script = server
    for _ in range(3):
        script.answers.append((429, {"error": "busy", "reason": "busy"}, {"Retry-After": "0"}))
    with pytest.raises(ApiError) as raised:
        AvccClient(url, KEY, SECRET, max_retries=1).apply_batch([_app_line(0)])
    assert raised.value.status == 429
