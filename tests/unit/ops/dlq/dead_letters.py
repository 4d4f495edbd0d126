"""Dead letters for the DLQ unit tests: a recording producer and an indexer of realistic DLQ records."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from app.ops.dlq.store import DlqStore
from app.platform.kafka.producers import Delivery
from schemas.system import FailureMetadata

T0 = 1_780_000_000_000


class FakeSender:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]], int | None]] = []
        self.fail = False

    async def send(
        self,
        topic: Any,
        value: bytes,
        key: bytes | None = None,
        headers: Any = None,
        partition: int | None = None,
    ) -> Delivery:
        if self.fail:
            raise RuntimeError("broker down")
        self.sent.append((str(topic), value, key, list(headers or []), partition))
        return Delivery(str(topic), partition or 0, len(self.sent) - 1)


def dead_letter(
    store: DlqStore,
    offset: int,
    *,
    partition: int = 0,
    topic: str = "topic.avcc.apply.created",
    group: str = "review",
    error_class: str = "app.platform.errors.DependencyTimeout",
    event_id: str | None = None,
    failed_ms: int = T0,
    value: bytes | None = None,
    key: bytes | None = b"10042",
    extra_headers: list[tuple[str, bytes]] | None = None,
    reinjected_count: int = 0,
) -> str:
    event_id = event_id or str(uuid.uuid4())
    meta = FailureMetadata(
        original_topic=topic,
        original_partition=3,
        original_offset=100 + offset,
        original_timestamp_ms=failed_ms - 5000,
        original_key=key.decode() if key else None,
        consumer_group=group,
        attempt=8,
        first_failure_ms=failed_ms - 4000,
        last_failure_ms=failed_ms,
        error_class=error_class,
        error_message="dependency <b>timed out</b>",
        stacktrace="Traceback (most recent call last):\n  ...\nDependencyTimeout: timed out",
        event_id=event_id,
        reinjected_count=reinjected_count,
    )
    headers = [("trace-id", b"abc"), *(extra_headers or []), *meta.to_headers()]
    body = value if value is not None else orjson.dumps({"event_id": event_id, "payload": {"x": 1}})
    entry, new = store.index(partition, offset, failed_ms + 10, key, body, headers)
    assert new
    return entry.dlq_id
