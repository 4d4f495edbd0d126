"""The partner client (app/client.py) against real code and gateway workers on a real broker."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer

from app.client import ApiError, AvccClient, DuplicateContent
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import PLAYBACK_EVENT, TOPIC_PLAN
from tests.integration.reads import end_offsets, read_to_sentinel
from tests.integration.stack import API_KEY, API_SECRET, Stack, application, wait_for

pytestmark = pytest.mark.integration

#: Batches above this are refused with 429 whatever the queue holds: a deterministic 429.
MAX_QUEUE = 100


@pytest.fixture(scope="module")
def gateway(stack_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root: Path = tmp_path_factory.mktemp("partner-gateway")
    apply_plan(Settings(kafka_url=f"kafka://{stack_broker.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    env = {"AVCC_GATEWAY_MAX_QUEUE": str(MAX_QUEUE), "AVCC_GATEWAY_RETRY_AFTER_S": "1"}
    stack = Stack(stack_broker.bootstrap, root, env=env)
    stack.start("gateway")
    yield stack
    stack.stop_all()


def playback_item(marker: str, i: int) -> dict[str, Any]:
    return {
        "avcc_code": f"MA.156.10005.8361/PC{marker}{i:05d}",
        "platform_node": "8361",
        "user_hash": "sha256:" + hashlib.sha256(f"{marker}-{i}".encode()).hexdigest(),
        "event_type": "play",
        "duration_sec": 30 + i,
        "revenue_cny": "0.00",
        "idempotency_id": f"{marker}-{i}",
    }


def produced_codes(bootstrap: str, marker: str, want: int, timeout_s: float = 60.0) -> set[str]:
    """avcc_code of every event of ``marker`` on the playback topic (stops at ``want``)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"partner-client-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([PLAYBACK_EVENT.name])
    codes: set[str] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(codes) < want and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            code = orjson.loads(message.value())["payload"]["avcc_code"]
            if f"/PC{marker}" in code:
                codes.add(code)
    finally:
        consumer.close()
    return codes


def test_client_applies_and_the_work_gets_its_code(core_stack: Stack) -> None:
    client = AvccClient(core_stack.url("code"), API_KEY, API_SECRET)
    body = application()
    receipt = client.apply(body)
    assert receipt["request_id"] == body["request_id"] and receipt["status"] == "submitted"
    record_id = receipt["avcc_record_id"]
    assert client.apply(body)["avcc_record_id"] == record_id
    with pytest.raises(DuplicateContent) as duplicate:
        client.apply({**body, "request_id": f"req_{uuid.uuid4().hex[:12]}"})
    assert duplicate.value.body["avcc_record_id"] == record_id
    record = wait_for(lambda: (r := client.record(record_id)).get("avcc_code") and r, timeout=90)
    assert record["status"] == "issued" and record["avcc_code"].startswith("MA.156.10005.8361/")
    with pytest.raises(ApiError) as bad:
        client.apply({**application(), "priority": 10})
    assert bad.value.status == 400 and "priority" in str(bad.value)


def test_client_sends_playback_in_batches(gateway: Stack) -> None:
    marker = uuid.uuid4().hex[:8]
    items = [playback_item(marker, i) for i in range(450)]
    items[17]["user_hash"] = "sha256:user123"
    items[333]["duration_sec"] = -1
    client = AvccClient(gateway.url("gateway"), API_KEY, API_SECRET)
    report = client.send_playback(items, batch_size=MAX_QUEUE)
    assert report.accepted == 448
    assert [(i, reason.split(":")[0]) for i, reason in report.rejected] == [
        (17, "user_hash"),
        (333, "duration_sec"),
    ]
    assert report.requests >= 5
    codes = produced_codes(gateway.bootstrap, marker, want=448)
    assert len(codes) == 448
    assert items[17]["avcc_code"] not in codes and items[333]["avcc_code"] not in codes


def test_client_honours_the_gateways_retry_after(gateway: Stack) -> None:
    marker = uuid.uuid4().hex[:8]
    client = AvccClient(gateway.url("gateway"), API_KEY, API_SECRET, max_retries=2)
    since = end_offsets(gateway.bootstrap, PLAYBACK_EVENT.name)
    started = time.monotonic()
    with pytest.raises(ApiError) as info:
        client.send_playback(
            [playback_item(marker, i) for i in range(MAX_QUEUE + 1)], batch_size=MAX_QUEUE + 1
        )
    elapsed = time.monotonic() - started
    assert info.value.status == 429 and info.value.body["reason"] == "backpressure"
    assert elapsed >= 2.0, "two waits of Retry-After: 1"
    # nothing of the refused batch was produced: the playback topic read to a sentinel batch
    # sent afterwards through the same gateway
    sentinel = uuid.uuid4().hex[:8]
    assert client.send_playback([playback_item(sentinel, 0)], batch_size=1).accepted == 1
    messages = read_to_sentinel(
        gateway.bootstrap,
        PLAYBACK_EVENT.name,
        lambda m: f"/PC{sentinel}".encode() in (m.value() or b""),
        start=since,
    )
    assert [m for m in messages if f"/PC{marker}".encode() in (m.value() or b"")] == []
