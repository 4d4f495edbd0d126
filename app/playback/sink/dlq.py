"""Dead letters of the sink: what a refused message becomes, and the producer that sends them.

A message the sink cannot store (undecodable, or breaking its contract) never blocks the batch:
it becomes a :class:`DeadLetter` (original bytes and key, ``FailureMetadata`` headers) that the
batch sends, acknowledged, before its offsets are committed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson
from confluent_kafka import Message

from app.platform.errors import DependencyUnavailable
from app.platform.kafka.clients import verified_producer
from app.platform.kafka.producers import EventProducer
from app.platform.settings import Settings
from schemas.system import FailureMetadata

__all__ = ["DeadLetter", "DeadLetterProducer", "DeadLetterSender", "dead_letter"]

#: ``client.id`` prefix of the sink's producer (the profile is appended: ``avcc-sink-core``).
CLIENT_ID = "avcc-sink"


@dataclass(slots=True)
class DeadLetter:
    """One message to dead-letter: original bytes and key, ``FailureMetadata`` headers."""

    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    source_topic: str
    error_class: str
    sent: bool = False


#: Sends dead letters and returns once all are acknowledged (raises otherwise).
DeadLetterSender = Callable[[Sequence[DeadLetter]], None]


def dead_letter(msg: Message, exc: Exception, *, group_id: str, topic: str) -> DeadLetter:
    """The dead letter of ``msg`` refused with ``exc`` (first and only attempt), for ``topic``."""
    now_ms = time.time_ns() // 1_000_000
    ts_type, ts = msg.timestamp()
    key = msg.key()
    value = msg.value() or b""
    error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
    meta = FailureMetadata(
        original_topic=msg.topic() or "?",
        original_partition=msg.partition() or 0,
        original_offset=msg.offset() or 0,
        original_timestamp_ms=ts if ts_type and ts is not None and ts >= 0 else -1,
        original_key=key.decode("utf-8", "backslashreplace") if key is not None else None,
        consumer_group=group_id,
        attempt=1,
        first_failure_ms=now_ms,
        last_failure_ms=now_ms,
        error_class=error_class,
        error_message=str(exc) or type(exc).__name__,
        event_id=_event_id_of(value),
    )
    return DeadLetter(topic, value, key, meta.to_headers(), msg.topic() or "?", error_class)


def _event_id_of(value: bytes) -> str | None:
    try:
        document = orjson.loads(value)
    except (orjson.JSONDecodeError, TypeError):
        return None
    event_id = document.get("event_id") if isinstance(document, dict) else None
    return event_id[:128] if isinstance(event_id, str) and event_id else None


class DeadLetterProducer:
    """Blocking dead-letter sends over a verified core-profile producer, from the sink thread.

    The producer is created on the first dead letter (most batches have none).
    """

    def __init__(self, settings: Settings, timeout_s: float) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.producer: EventProducer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, letters: Sequence[DeadLetter]) -> None:
        if self.producer is None:
            self.producer = verified_producer(self.settings, "core", CLIENT_ID)
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        messages = [(d.topic, d.value, d.key, d.headers) for d in letters]
        try:
            self._loop.run_until_complete(asyncio.wait_for(self.producer.send_many(messages), self.timeout_s))
        except TimeoutError as exc:
            raise DependencyUnavailable(f"DLQ sends not acknowledged within {self.timeout_s}s") from exc

    def close(self) -> None:
        """Flush and close the producer, release the private event loop."""
        producer, self.producer = self.producer, None
        if producer is not None:
            producer.close(10.0)
        if self._loop is not None and not self._loop.is_running():
            self._loop.close()
            self._loop = None
