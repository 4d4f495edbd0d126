"""Gateway HTTP ingest against a real broker: per-item errors, HMAC refusals, limits, backpressure."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from confluent_kafka.admin import AdminClient, NewTopic

from app.platform.http.auth import HEADER_SIGNATURE, NonceCache, sign_request
from app.platform.settings import Settings
from app.playback.gateway.endpoint import ROUTE, PlaybackIngest
from app.playback.gateway.ingest import EVENT_ID_NAMESPACE
from app.playback.gateway.settings import GatewaySettings
from schemas.envelope import Envelope
from schemas.playback import PlaybackEvent
from tests.integration.reads import read_range, read_to_sentinel

pytestmark = pytest.mark.integration

KEY, SECRET = "partner-a", "partner-a-secret"


def item(i: int, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "avcc_code": f"MA.156.10005.8361/AV{i:08d}",
        "platform_node": "8361",
        "user_hash": "sha256:" + hashlib.sha256(f"u{i}".encode()).hexdigest(),
        "event_type": "play",
        "duration_sec": 60 + i,
        "revenue_cny": "0.00",
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


@dataclass
class Gateway:
    url: str
    topic: str
    bootstrap: str
    ingest: PlaybackIngest
    session: aiohttp.ClientSession

    async def post(
        self,
        body: bytes,
        content_type: str = "application/json",
        *,
        headers: dict[str, str] | None = None,
        key: str = KEY,
        secret: str = SECRET,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        signed = headers if headers is not None else sign_request("POST", ROUTE, body, key, secret)
        async with self.session.post(
            self.url + ROUTE, data=body, headers={**signed, "Content-Type": content_type}
        ) as response:
            return response.status, orjson.loads(await response.read()), dict(response.headers)

    def produced(self) -> list[tuple[bytes, bytes]]:
        """(key, value) of every message on the topic: the gateway's producer is flushed first
        (every message it accepted acknowledged), then the topic is read to its end offsets."""
        assert self.ingest.producer.flush(10) == 0
        return [(m.key(), m.value()) for m in read_range(self.bootstrap, self.topic)]

    async def produced_before_sentinel(self) -> list[tuple[bytes, bytes]]:
        """(key, value) of every message on the topic before a sentinel: a valid one-item batch
        posted now through the same gateway and producer, read until it arrives (and every
        partition to its end offset then); the sentinel left out."""
        sentinel = item(SENTINEL, duration_sec=60)
        status, body, _ = await self.post(orjson.dumps([sentinel]))
        assert status == 202 and body["accepted"] == 1, body
        self.ingest.producer.flush(10)
        code = sentinel["avcc_code"].encode()
        messages = read_to_sentinel(self.bootstrap, self.topic, lambda m: code in (m.value() or b""))
        return [(m.key(), m.value()) for m in messages]


#: The item number of the sentinels: no test posts it otherwise.
SENTINEL = 99_999_999


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30).values():
        future.result(timeout=30)


async def start_gateway(broker: Any, unique: str, limits: GatewaySettings) -> tuple[TestServer, Gateway]:
    topic = f"playback-{unique}"
    create_topic(broker.bootstrap, topic, 24)
    settings = Settings(
        kafka_url=f"kafka://{broker.bootstrap}",
        hmac_keys={KEY: SECRET},
        hmac_max_skew_ms=60_000,
    )
    ingest = PlaybackIngest(settings, limits, topic=topic, nonces=NonceCache(120_000))
    web_app = web.Application(client_max_size=limits.max_body_bytes * 2)
    web_app.router.add_post(ROUTE, ingest.handle)
    server = TestServer(web_app)
    await server.start_server()
    session = aiohttp.ClientSession()
    gateway = Gateway(str(server.make_url("")).rstrip("/"), topic, broker.bootstrap, ingest, session)
    return server, gateway


@pytest.fixture
async def gateway(broker: Any, unique: str) -> AsyncIterator[Gateway]:
    server, gw = await start_gateway(broker, unique, GatewaySettings(max_items=50, max_body_bytes=64 * 1024))
    yield gw
    await gw.session.close()
    await server.close()
    gw.ingest.close(10)


async def test_mixed_batch_produces_only_valid_items(gateway: Gateway) -> None:
    batch: list[Any] = [
        item(0),
        item(1, user_hash="sha256:nothex"),
        item(2, idempotency_id="platform-evt-2"),
        item(3, duration_sec=None),
        "not an object",
        item(5, event_type="purchase", revenue_cny="12.50"),
        item(6, revenue_cny="1.999"),
    ]
    status, body, _ = await gateway.post(orjson.dumps(batch))
    assert status == 202, body
    assert body["accepted"] == 3 and body["rejected"] == 4
    errors = {e["index"]: e["error"] for e in body["errors"]}
    assert sorted(errors) == [1, 3, 4, 6]
    assert errors[1].startswith("user_hash: ")
    assert errors[3] == "duration_sec: required field missing"
    assert errors[4] == "<root>: must be a JSON object"
    assert errors[6].startswith("revenue_cny: ")

    messages = gateway.produced()
    assert len(messages) == 3
    envelopes = [Envelope[PlaybackEvent].model_validate_json(value) for _, value in messages]
    for (key, _), envelope in zip(messages, envelopes, strict=True):
        assert key == str(envelope.event_id).encode()
        assert envelope.source == "gateway-svc"
    by_code = {e.payload.avcc_code: e for e in envelopes}
    assert sorted(by_code) == [item(i)["avcc_code"] for i in (0, 2, 5)]
    idempotent = by_code[item(2)["avcc_code"]]
    assert idempotent.event_id == uuid.uuid5(EVENT_ID_NAMESPACE, "8361:platform-evt-2")
    assert by_code[item(0)["avcc_code"]].event_id.version == 4
    assert str(by_code[item(5)["avcc_code"]].payload.revenue_cny) == "12.50"


async def test_ndjson_with_a_broken_line(gateway: Gateway) -> None:
    lines = [orjson.dumps(item(10)), b"{not json", b"", orjson.dumps(item(11))]
    status, body, _ = await gateway.post(b"\n".join(lines) + b"\n", "application/x-ndjson")
    assert status == 202, body
    assert (body["accepted"], body["rejected"]) == (2, 1)
    assert body["errors"][0]["index"] == 1 and "malformed JSON" in body["errors"][0]["error"]
    assert len(gateway.produced()) == 2


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("bad_signature", "bad_signature"),
        ("unknown_key", "bad_signature"),  # answered like a wrong signature: ids cannot be probed
        ("stale", "stale_timestamp"),
        ("missing", "missing_header"),
    ],
)
async def test_refused_requests_get_401_and_produce_nothing(gateway: Gateway, case: str, reason: str) -> None:
    body = orjson.dumps([item(20)])
    headers = sign_request("POST", ROUTE, body, KEY, SECRET)
    if case == "bad_signature":
        headers = sign_request("POST", ROUTE, body, KEY, "wrong-secret")
    elif case == "unknown_key":
        headers = sign_request("POST", ROUTE, body, "partner-x", SECRET)
    elif case == "stale":
        headers = sign_request(
            "POST", ROUTE, body, KEY, SECRET, timestamp_ms=int(time.time() * 1000) - 120_000
        )
    else:
        headers.pop(HEADER_SIGNATURE)
    status, answer, _ = await gateway.post(body, headers=headers)
    assert status == 401
    assert answer["reason"] == reason and answer["error"]
    assert await gateway.produced_before_sentinel() == []


async def test_replayed_request_is_refused(gateway: Gateway) -> None:
    body = orjson.dumps([item(30)])
    headers = sign_request("POST", ROUTE, body, KEY, SECRET)
    first = await gateway.post(body, headers=headers)
    second = await gateway.post(body, headers=headers)
    assert first[0] == 202
    assert second[0] == 401 and second[1]["reason"] == "replayed_nonce"
    assert len(gateway.produced()) == 1


async def test_limits_answer_413(gateway: Gateway) -> None:
    too_many = orjson.dumps([item(i) for i in range(51)])
    status, body, _ = await gateway.post(too_many)
    assert status == 413 and body["reason"] == "too_many_items"
    too_big = orjson.dumps([item(0, idempotency_id="x" * 100)] * 300)
    assert len(too_big) > 64 * 1024
    status, body, _ = await gateway.post(too_big)
    assert status == 413 and body["reason"] == "body_too_large"
    status, body, _ = await gateway.post(b'{"not": "an array"}')
    assert status == 400 and body["reason"] == "not_an_array"
    status, body, _ = await gateway.post(b"[]")
    assert status == 400 and body["reason"] == "empty_batch"
    status, body, _ = await gateway.post(b"[]", "text/plain")
    assert status == 415
    assert await gateway.produced_before_sentinel() == []


async def test_backpressure_answers_429_with_retry_after(broker: Any, unique: str) -> None:
    server, gateway = await start_gateway(broker, unique, GatewaySettings(max_queue=3, retry_after_s=2))
    try:
        status, body, headers = await gateway.post(orjson.dumps([item(i) for i in range(5)]))
        assert status == 429
        assert headers["Retry-After"] == "2" and body["reason"] == "backpressure"
        status, body, _ = await gateway.post(orjson.dumps([item(i) for i in range(3)]))
        assert status == 202 and body["accepted"] == 3
        assert len(gateway.produced()) == 3
    finally:
        await gateway.session.close()
        await server.close()
        gateway.ingest.close(10)
