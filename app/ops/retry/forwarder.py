"""The retry forwarder: delayed redelivery of ``topic.system.retry`` (seed 9.3.3 step 2).

A message lands on the retry topic when a group's in-process retries are spent (or when it is
parked behind such a message of its key, see :mod:`app.platform.faust.runtime`). Its
``avcc-not-before-ms`` header says when it may be retried. :class:`RetryForwarder` reads the retry
topic with a confluent-kafka consumer (manual commits) on its own thread and, per partition, in
order:

* a message not yet due: the partition is paused and the consumer seeks back to the message; the
  partition resumes when it is due. Other partitions keep flowing; nothing sleeps on the consumer.
* a due message: key, value and headers are re-produced unchanged (``avcc-target-group``
  included) to the original topic and partition (``avcc-original-topic`` /
  ``avcc-original-partition``) with the core producer; once the broker acknowledged, the offset is
  committed. The target group processes it, every other group skips it by the header.
* a message without an original topic cannot be redelivered: it goes to the DLQ as is.

A crash between the ack and the commit redelivers once more; consumers dedup on ``event_id``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Collection
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from app.ops.retry.schedule import (
    HEADER_ORIGINAL_PARTITION,
    HEADER_ORIGINAL_TOPIC,
    PRODUCE_BACKOFF_S,
    PartitionHolds,
    due_at,
)
from app.platform.faust.app import consumer_group_id
from app.platform.faust.runtime import HEADER_TARGET_GROUP, header_value, now_ms
from app.platform.kafka.clients import consumer_config, verified_producer
from app.platform.kafka.consumer_loop import ConsumerLoop
from app.platform.kafka.producers import EventProducer
from app.platform.metrics import RETRY_REDELIVERED, RETRY_REDELIVERY_LATENESS, RETRY_WAITING_PARTITIONS
from app.platform.settings import Settings, get_settings
from app.platform.topics import DLQ, RETRY

__all__ = ["RetryConsumer", "RetryForwarder"]

log = logging.getLogger(__name__)

#: ``client.id`` of the forwarder's consumer and producer.
CLIENT_ID = "avcc-retry"


class RetryConsumer(ConsumerLoop):
    """The forwarder's consumer: a fresh or lost partition starts with no holds."""

    def __init__(self, config: dict[str, Any], topic: str, holds: PartitionHolds) -> None:
        super().__init__(config, [topic])
        self.holds = holds

    def on_assigned(self, partitions: list[TopicPartition]) -> None:
        """Forget any holds of the new partitions."""
        for tp in partitions:
            self.holds.forget((tp.topic, tp.partition))
        if partitions:
            log.info("retry forwarder assigned %s", sorted(tp.partition for tp in partitions))

    def on_revoked(self, partitions: list[TopicPartition], lost: bool) -> None:
        """Forget the holds of partitions this forwarder no longer owns."""
        for tp in partitions:
            self.holds.forget((tp.topic, tp.partition))
        RETRY_WAITING_PARTITIONS.set(len(self.holds.paused))


class RetryForwarder:
    """Redelivers due retry-topic messages to their original topics (see the module docstring).

    ``target_groups`` restricts it to messages meant for those groups (others are skipped and
    committed); ``None`` forwards everything (production). The retry group runs it as its own
    consumer (:mod:`app.platform.faust.own_consumer`).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        group_id: str | None = None,
        topic: str = RETRY.name,
        target_groups: Collection[str] | None = None,
        auto_offset_reset: Literal["earliest", "latest"] = "earliest",
    ) -> None:
        self.settings = settings or get_settings()
        self.group_id = group_id or consumer_group_id("retry")
        self.topic = topic
        self.target_groups = frozenset(target_groups) if target_groups is not None else None
        self.auto_offset_reset = auto_offset_reset
        self.holds = PartitionHolds()
        # low volume; a short broker wait makes a resumed partition redeliver promptly
        fetch: dict[str, Any] = {"fetch.wait.max.ms": 100}
        config = consumer_config(
            self.settings, self.group_id, CLIENT_ID, auto_offset_reset=auto_offset_reset, **fetch
        )
        self.consumer_loop = RetryConsumer(config, topic, self.holds)
        self._producer: EventProducer | None = None
        self._stopping = threading.Event()
        self.forwarded = 0

    def assignment(self) -> list[tuple[str, int]]:
        """``(topic, partition)`` pairs this forwarder's consumer owns."""
        return sorted(self.consumer_loop.assigned)

    async def _call(self, fun: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fun`` on the consumer's own thread."""
        return await self.consumer_loop.call(functools.partial(fun, *args, **kwargs))

    def readiness(self) -> tuple[bool, str]:
        """Ready once assigned: a held-back message is read again where it was."""
        return True, ""

    # -- lifecycle -----------------------------------------------------------------------------
    async def serve(self) -> None:
        """Create the producer, then the consumer and its subscription; forward until
        :meth:`stop`; then close the consumer (after its last poll) and flush the producer."""
        loop = asyncio.get_running_loop()
        self._producer = await loop.run_in_executor(None, verified_producer, self.settings, "core", CLIENT_ID)
        await self._call(self.consumer_loop.open)
        try:
            while not self._stopping.is_set():
                try:
                    await self.step()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # broker hiccups must not kill the forwarder
                    log.exception("retry forwarder error: %r", exc)
                    await asyncio.sleep(1.0)
        finally:
            await self._shut()

    def stop(self) -> None:
        """Ask :meth:`serve` to return after the current step (from any thread)."""
        self._stopping.set()

    async def _shut(self) -> None:
        if self.consumer_loop.consumer is not None:
            await self._call(self.consumer_loop.close)
        self.consumer_loop.shutdown_thread()
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await asyncio.get_running_loop().run_in_executor(None, producer.close)

    # -- main loop -----------------------------------------------------------------------------
    async def step(self) -> None:
        """Resume due partitions, poll once and handle what arrived."""
        consumer = self.consumer_loop.consumer
        if consumer is None:
            await asyncio.sleep(0.1)
            return
        await self._resume_due(consumer)
        message = await self._call(consumer.poll, self._poll_timeout())
        if message is None:
            return
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("retry consumer error: %s", error)
            return
        await self.handle(consumer, message)

    def _poll_timeout(self) -> float:
        return self.holds.poll_timeout(now_ms())

    async def _resume_due(self, consumer: Consumer) -> None:
        due = self.holds.take_due(now_ms())
        if not due:
            return
        await self._call(consumer.resume, [TopicPartition(t, p) for t, p in due])
        RETRY_WAITING_PARTITIONS.set(len(self.holds.paused))

    async def _hold(self, consumer: Consumer, message: Message, until_ms: int) -> None:
        """Pause the message's partition and rewind to it, so it is read again when due."""
        await self._rewind(consumer, (message.topic(), message.partition()), message.offset(), until_ms)

    async def _rewind(self, consumer: Consumer, tp: tuple[str, int], offset: int, until_ms: int) -> None:
        await self._call(consumer.pause, [TopicPartition(tp[0], tp[1])])
        await self._call(consumer.seek, TopicPartition(tp[0], tp[1], offset))
        self.holds.hold(tp, offset, until_ms)
        RETRY_WAITING_PARTITIONS.set(len(self.holds.paused))

    async def handle(self, consumer: Consumer, message: Message) -> None:
        """Hold, skip, forward or dead-letter one message (in order within its partition)."""
        tp = (message.topic(), message.partition())
        offset = message.offset()
        arrival = self.holds.arrival(tp, offset)
        if arrival == "stale":
            return  # prefetched before the partition was paused/rewound: it will come again
        if arrival == "lost_seek":
            expected = self.holds.expected[tp]
            log.warning(
                "retry %s[%d]: expected offset %d after rewinding, got %d; rewinding again",
                tp[0],
                tp[1],
                expected,
                offset,
            )
            await self._rewind(consumer, tp, expected, now_ms())
            return
        if arrival == "gone":
            log.error(
                "retry %s[%d]: offset %d is gone (retention?); continuing at %d",
                tp[0],
                tp[1],
                self.holds.expected[tp],
                offset,
            )
        headers = message.headers() or []
        target = header_value(headers, HEADER_TARGET_GROUP)
        if self.target_groups is not None and (target is None or target.decode() not in self.target_groups):
            await self._commit(consumer, message)
            return
        not_before = due_at(headers)
        if not_before > now_ms():
            await self._hold(consumer, message, not_before)
            return
        try:
            await self._forward(message, headers, target, not_before)
        except Exception as exc:  # produce failed: retry this message later, keep order
            log.warning(
                "retry redelivery of %s[%d]@%d failed, retrying in %.0fs: %s",
                tp[0],
                tp[1],
                offset,
                PRODUCE_BACKOFF_S,
                exc,
            )
            await self._hold(consumer, message, now_ms() + int(PRODUCE_BACKOFF_S * 1000))
            return
        await self._commit(consumer, message)
        self.forwarded += 1

    async def _forward(self, message: Message, headers: Any, target: bytes | None, not_before: int) -> None:
        assert self._producer is not None
        original = header_value(headers, HEADER_ORIGINAL_TOPIC)
        value = message.value() or b""
        if not original:
            log.error(
                "retry message %s[%d]@%d has no %s header; dead-lettering it",
                message.topic(),
                message.partition(),
                message.offset(),
                HEADER_ORIGINAL_TOPIC,
            )
            await self._producer.send(DLQ, value, message.key(), list(headers))
            return
        raw_partition = header_value(headers, HEADER_ORIGINAL_PARTITION)
        partition = int(raw_partition) if raw_partition and raw_partition.isdigit() else None
        topic = original.decode()
        await self._producer.send(topic, value, message.key(), list(headers), partition)
        RETRY_REDELIVERED.labels(target.decode() if target else "", topic).inc()
        if not_before:
            RETRY_REDELIVERY_LATENESS.observe(max(0.0, (now_ms() - not_before) / 1000))

    async def _commit(self, consumer: Consumer, message: Message) -> None:
        tp = TopicPartition(message.topic(), message.partition(), message.offset() + 1)
        self.holds.committed((tp.topic, tp.partition), tp.offset)
        await self._call(consumer.commit, offsets=[tp], asynchronous=False)
