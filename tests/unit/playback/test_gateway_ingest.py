"""Gateway ingest without HTTP or a broker: batch parsing, event ids, envelope framing, admission."""

from __future__ import annotations

import os
import uuid
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from app.platform.http.batch_body import NDJSON, BatchError, parse_items
from app.playback.gateway.ingest import (
    CHUNK,
    EVENT_ID_NAMESPACE,
    QUEUE_FULL,
    admit,
    envelope_bytes,
    event_id_for,
    uuid4_texts,
)
from schemas.playback import PlaybackEvent
from schemas.violations import to_schema_violation
from tests.unit.playback.playback_documents import payload


class QueueProducer:
    """Accepts ``room`` messages, then raises ``BufferError`` like a full librdkafka queue."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    def send_nowait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        if len(self.sent) >= self.room:
            raise BufferError("queue full")
        self.sent.append((topic, value, key))

    def send_many_nowait(self, topic: str, values: list[bytes], keys: list[bytes]) -> int:
        for count, (value, key) in enumerate(zip(values, keys, strict=True)):
            try:
                self.send_nowait(topic, value, key)
            except BufferError:
                return count
        return len(values)


def test_json_and_ndjson_bodies_give_items_and_per_line_errors() -> None:
    assert parse_items(orjson.dumps([payload(), 1]), "application/json") == ([payload(), 1], {})
    items, errors = parse_items(orjson.dumps(payload()) + b"\n\n{nope\n" + orjson.dumps(payload()), NDJSON)
    assert items == [payload(), None, payload()]
    assert list(errors) == [1] and errors[1].startswith("<root>: malformed JSON")


@pytest.mark.parametrize(
    ("body", "content_type", "status", "reason"),
    [
        (b"{", "application/json", 400, "malformed_json"),
        (b'{"a": 1}', "", 400, "not_an_array"),
        (b"[]", "application/json", 400, "empty_batch"),
        (b"\n \n", NDJSON, 400, "empty_batch"),
        (b"[]", "text/plain", 415, "unsupported_media_type"),
    ],
)
def test_unreadable_batches_say_why(body: bytes, content_type: str, status: int, reason: str) -> None:
    with pytest.raises(BatchError) as caught:
        parse_items(body, content_type)
    assert (caught.value.status, caught.value.reason) == (status, reason)


def test_event_ids_are_name_based_for_idempotent_items_else_random_v4() -> None:
    keyed = PlaybackEvent.model_validate(payload(idempotency_id="order-1"))
    assert event_id_for(keyed) == str(uuid.uuid5(EVENT_ID_NAMESPACE, "8361:order-1"))
    random_id = uuid.UUID(event_id_for(PlaybackEvent.model_validate(payload()), bytes(16)))
    assert random_id.version == 4


def test_envelope_bytes_frame_the_validated_event() -> None:
    event = PlaybackEvent.model_validate(payload(revenue_cny="12.5"))
    document = orjson.loads(envelope_bytes(event, "id-1", 1_717_312_200_000))
    assert document == {
        "event_id": "id-1",
        "timestamp": 1_717_312_200_000,
        "source": "gateway-svc",
        "payload": payload(revenue_cny="12.50"),
    }


def test_admission_produces_valid_items_and_reports_the_rest_by_index() -> None:
    producer = QueueProducer(room=10)
    items: list[Any] = [payload(), "x", payload(user_hash="nope"), None, payload(idempotency_id="k")]
    admission = admit(items, {3: "<root>: malformed JSON (x)"}, producer, "pb")  # type: ignore[arg-type]
    assert admission.accepted == 2 and admission.throttled_from is None
    assert sorted(admission.errors) == [1, 2, 3]
    assert admission.errors[1] == "<root>: must be a JSON object"
    assert [topic for topic, _, _ in producer.sent] == ["pb", "pb"]
    assert all(key == orjson.loads(value)["event_id"].encode() for _, value, key in producer.sent)
    assert admission.body()["rejected"] == 3


def test_a_full_queue_stops_the_batch_and_marks_every_item_left() -> None:
    producer = QueueProducer(room=1)
    admission = admit([payload(), payload(), "x", payload()], {}, producer, "pb")  # type: ignore[arg-type]
    assert (admission.accepted, admission.throttled_from) == (1, 1)
    assert admission.errors == {1: QUEUE_FULL, 2: QUEUE_FULL, 3: QUEUE_FULL}


def _keyed(index: int, **fields: Any) -> dict[str, Any]:
    return payload(idempotency_id=f"order-{index}", **fields)


def test_the_columnar_path_frames_the_same_bytes_as_the_validated_models() -> None:
    """A chunk proved valid column-wise gives exactly what per-item validation would give."""
    items: list[Any] = [
        _keyed(i, revenue_cny=("12.5" if i % 3 else "0.07")) if i % 2 else payload(duration_sec=i)
        for i in range(CHUNK)
    ]
    fast = QueueProducer(room=CHUNK)
    assert admit(items, {}, fast, "pb").accepted == CHUNK  # type: ignore[arg-type]
    for item, (_, value, key) in zip(items, fast.sent, strict=True):
        document = orjson.loads(value)
        event = PlaybackEvent.model_validate(item)
        assert value == envelope_bytes(event, document["event_id"], document["timestamp"])
        assert key == document["event_id"].encode()
        if event.idempotency_id is not None:
            assert document["event_id"] == event_id_for(event)
        else:
            assert uuid.UUID(document["event_id"]).version == 4
    keyed = [item for item in items if "idempotency_id" in item]
    fast_keyed, slow = QueueProducer(room=CHUNK), QueueProducer(room=CHUNK)
    assert admit(keyed, {}, fast_keyed, "pb").accepted == len(keyed)  # type: ignore[arg-type]
    # One refused index (as an NDJSON line that is not JSON would be) sends the chunk item by item.
    refused = {len(keyed): "bad"}
    assert admit([*keyed, None], refused, slow, "pb").accepted == len(keyed)  # type: ignore[arg-type]
    assert [(_untimed(v), k) for _, v, k in fast_keyed.sent] == [(_untimed(v), k) for _, v, k in slow.sent]


@pytest.mark.parametrize("entropy", [bytes(16), b"\xff" * 16, bytes(range(256)) * 3, os.urandom(16 * 777)])
def test_uuid4_texts_are_what_the_uuid_module_writes_for_the_same_bytes(entropy: bytes) -> None:
    expected = [str(uuid.UUID(bytes=entropy[i : i + 16], version=4)) for i in range(0, len(entropy), 16)]
    assert uuid4_texts(entropy) == expected


def test_random_event_ids_in_a_batch_are_distinct_uuid4s_in_item_order() -> None:
    items = [payload(duration_sec=i) for i in range(3 * CHUNK + 5)]
    producer = QueueProducer(room=len(items))
    assert admit(items, {}, producer, "pb").accepted == len(items)  # type: ignore[arg-type]
    ids = [orjson.loads(value)["event_id"] for _, value, _ in producer.sent]
    assert [orjson.loads(value)["payload"]["duration_sec"] for _, value, _ in producer.sent] == list(
        range(len(items))
    )
    assert len(set(ids)) == len(items)
    assert all(uuid.UUID(event_id).version == 4 for event_id in ids)


def _untimed(value: bytes) -> bytes:
    """Envelope bytes with the timestamp zeroed (the batches compared were admitted apart)."""
    document = orjson.loads(value)
    return value.replace(b'"timestamp":%d' % document["timestamp"], b'"timestamp":0')


def test_errors_are_the_models_whichever_path_a_chunk_takes() -> None:
    """Invalid items in a batch of several chunks are answered with the model's own messages."""
    items: list[Any] = [payload() for _ in range(3 * CHUNK)]
    bad = {5: {"duration_sec": "1"}, CHUNK + 7: {"revenue_cny": 1.234}, 2 * CHUNK: {"event_type": "skip"}}
    for index, change in bad.items():
        items[index] = {**items[index], **change}
    producer = QueueProducer(room=len(items))
    admission = admit(items, {}, producer, "pb")  # type: ignore[arg-type]
    assert admission.accepted == len(items) - len(bad)
    assert sorted(admission.errors) == sorted(bad)
    for index in bad:
        with pytest.raises(ValidationError) as refused:
            PlaybackEvent.model_validate(items[index])
        assert admission.errors[index] == str(to_schema_violation(refused.value))


def test_items_past_a_full_queue_are_queue_full_even_if_invalid() -> None:
    items: list[Any] = [payload(), payload(), payload(user_hash="nope"), payload()]
    admission = admit(items, {}, QueueProducer(room=1), "pb")  # type: ignore[arg-type]
    assert admission.errors == {1: QUEUE_FULL, 2: QUEUE_FULL, 3: QUEUE_FULL}


def test_an_array_over_the_item_cap_is_refused_with_its_count() -> None:
    body = orjson.dumps([payload() for _ in range(11)])
    with pytest.raises(BatchError) as refused:
        parse_items(body, "application/json", max_items=10)
    assert refused.value.status == 413 and "11 items" in str(refused.value)
