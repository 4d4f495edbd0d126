"""Gateway ingest without HTTP or a broker: batch parsing, event ids, envelope framing, admission."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest

from app.playback.gateway.ingest import (
    EVENT_ID_NAMESPACE,
    NDJSON,
    QUEUE_FULL,
    BatchError,
    admit,
    envelope_bytes,
    event_id_for,
    parse_items,
)
from schemas.playback import PlaybackEvent
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
