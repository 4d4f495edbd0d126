"""retry group (retry-svc): the delayed redelivery of ``topic.system.retry`` (seed 9.3.3 step 2).

A message lands on the retry topic when a group's in-process retries are spent (or when it is
parked behind such a message of its key, see :mod:`app.platform.faust.runtime`). Its ``avcc-not-before-ms``
header says when it may be retried. :class:`RetryForwarder` reads the retry topic with a
confluent-kafka consumer (manual commits) in a dedicated thread and, per partition, in order:

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
import logging
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from mode import Service

from app.platform.faust.app import consumer_group_id, get_app
from app.platform.faust.runtime import HEADER_TARGET_GROUP, header_value, now_ms
from app.platform.http.views import install_common_views
from app.platform.kafka.producers import EventProducer
from app.platform.metrics import RETRY_REDELIVERED, RETRY_REDELIVERY_LATENESS, RETRY_WAITING_PARTITIONS
from app.platform.settings import Settings, get_settings
from app.platform.topics import DLQ, RETRY
from schemas.system import header_name

__all__ = ["HEADER_NOT_BEFORE", "RetryForwarder", "RetryService", "app", "due_at"]

log = logging.getLogger(__name__)

app = get_app("retry")
#: The running forwarder (set when the worker starts it), for ``/ready`` and the lag export.
_running: list[RetryForwarder] = []


def _assignment() -> list[tuple[str, int]]:
    return _running[0].assignment() if _running else []


common = install_common_views(app, "retry", assignment=_assignment)

HEADER_NOT_BEFORE = header_name("not_before_ms")
HEADER_ORIGINAL_TOPIC = header_name("original_topic")
HEADER_ORIGINAL_PARTITION = header_name("original_partition")
#: Pause a partition this long after a failed produce before trying its head message again.
PRODUCE_BACKOFF_S = 2.0
#: Longest single poll, so due partitions are resumed on time and stop requests are noticed.
MAX_POLL_S = 0.5


def due_at(headers: Any) -> int:
    """Epoch ms from which the message may be redelivered (0: now; unparsable counts as now)."""
    raw = header_value(headers, HEADER_NOT_BEFORE)
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        return 0


class RetryForwarder(Service):
    """Redelivers due retry-topic messages to their original topics (see the module docstring).

    ``target_groups`` restricts it to messages meant for those groups (others are skipped and
    committed); ``None`` forwards everything (production).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        group_id: str | None = None,
        topic: str = RETRY.name,
        target_groups: Collection[str] | None = None,
        auto_offset_reset: str = "earliest",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.settings = settings or get_settings()
        self.group_id = group_id or consumer_group_id("retry")
        self.topic = topic
        self.target_groups = frozenset(target_groups) if target_groups is not None else None
        self.auto_offset_reset = auto_offset_reset
        self._consumer: Consumer | None = None
        self._producer: EventProducer | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retry-consumer")
        #: (topic, partition) -> epoch ms when it may resume.
        self._paused: dict[tuple[str, int], int] = {}
        #: (topic, partition) -> next offset to handle (older deliveries are stale prefetches).
        self._expected: dict[tuple[str, int], int] = {}
        #: (topic, partition) -> rewinds since its head message was last handled.
        self._rewound: dict[tuple[str, int], int] = {}
        self._assigned: set[tuple[str, int]] = set()
        self.assigned = asyncio.Event()
        self.forwarded = 0

    def assignment(self) -> list[tuple[str, int]]:
        """``(topic, partition)`` pairs this forwarder's consumer owns."""
        return sorted(self._assigned)

    # -- lifecycle -----------------------------------------------------------------------------
    async def _call(self, fun: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fun(*args, **kwargs))

    def _make_producer(self) -> EventProducer:
        producer = EventProducer(self.settings, "core", client_id="avcc-retry")
        producer.verify_profile()
        return producer

    async def on_start(self) -> None:
        """Create the producer, then the consumer and its subscription."""
        loop = asyncio.get_running_loop()
        self._producer = await loop.run_in_executor(None, self._make_producer)
        self._consumer = Consumer(
            {
                **self.settings.kafka_client_config(),
                "group.id": self.group_id,
                "client.id": "avcc-retry",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": self.auto_offset_reset,
                "session.timeout.ms": self.settings.kafka_session_timeout_ms,
                "heartbeat.interval.ms": max(1000, self.settings.kafka_session_timeout_ms // 5),
                # low volume; a short broker wait makes a resumed partition redeliver promptly
                "fetch.wait.max.ms": 100,
            }
        )
        assigned = self.assigned

        def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            for tp in partitions:
                self._paused.pop((tp.topic, tp.partition), None)
                self._expected.pop((tp.topic, tp.partition), None)
                self._rewound.pop((tp.topic, tp.partition), None)
                self._assigned.add((tp.topic, tp.partition))
            if partitions:
                log.info("retry forwarder assigned %s", sorted(tp.partition for tp in partitions))
                loop.call_soon_threadsafe(assigned.set)

        def on_revoke(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            for tp in partitions:
                self._paused.pop((tp.topic, tp.partition), None)
                self._expected.pop((tp.topic, tp.partition), None)
                self._rewound.pop((tp.topic, tp.partition), None)
                self._assigned.discard((tp.topic, tp.partition))
            RETRY_WAITING_PARTITIONS.set(len(self._paused))

        await self._call(
            self._consumer.subscribe,
            [self.topic],
            on_assign=on_assign,
            on_revoke=on_revoke,
            on_lost=on_revoke,
        )
        log.info("retry forwarder consuming %s as %s", self.topic, self.group_id)

    async def on_shutdown(self) -> None:
        """Close the consumer (after its last poll) and flush the producer."""
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await self._call(consumer.close)
        self._pool.shutdown(wait=True)
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await asyncio.get_running_loop().run_in_executor(None, producer.close)

    # -- main loop -----------------------------------------------------------------------------
    @Service.task
    async def _forward_loop(self) -> None:
        while not self.should_stop:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # broker hiccups must not kill the forwarder
                log.exception("retry forwarder error: %r", exc)
                await self.sleep(1.0)

    async def step(self) -> None:
        """Resume due partitions, poll once and handle what arrived."""
        consumer = self._consumer
        if consumer is None:
            await self.sleep(0.1)
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
        if not self._paused:
            return MAX_POLL_S
        wait_s = (min(self._paused.values()) - now_ms()) / 1000
        return max(0.01, min(MAX_POLL_S, wait_s))

    async def _resume_due(self, consumer: Consumer) -> None:
        now = now_ms()
        due = [tp for tp, at in self._paused.items() if at <= now]
        if not due:
            return
        for tp in due:
            del self._paused[tp]
        await self._call(consumer.resume, [TopicPartition(t, p) for t, p in due])
        RETRY_WAITING_PARTITIONS.set(len(self._paused))

    async def _hold(self, consumer: Consumer, message: Message, until_ms: int) -> None:
        """Pause the message's partition and rewind to it, so it is read again when due."""
        await self._rewind(consumer, (message.topic(), message.partition()), message.offset(), until_ms)

    async def _rewind(self, consumer: Consumer, tp: tuple[str, int], offset: int, until_ms: int) -> None:
        await self._call(consumer.pause, [TopicPartition(tp[0], tp[1])])
        await self._call(consumer.seek, TopicPartition(tp[0], tp[1], offset))
        self._paused[tp] = until_ms
        self._expected[tp] = offset
        self._rewound[tp] = self._rewound.get(tp, 0) + 1
        RETRY_WAITING_PARTITIONS.set(len(self._paused))

    async def handle(self, consumer: Consumer, message: Message) -> None:
        """Hold, skip, forward or dead-letter one message (in order within its partition)."""
        tp = (message.topic(), message.partition())
        offset = message.offset()
        expected = self._expected.get(tp, -1)
        if tp in self._paused or offset < expected:
            return  # prefetched before the partition was paused/rewound: it will come again
        if offset > expected >= 0 and tp in self._rewound:
            # The held message did not come back first (a lost seek): never skip it silently.
            if self._rewound[tp] <= 3:
                log.warning(
                    "retry %s[%d]: expected offset %d after rewinding, got %d; rewinding again",
                    tp[0],
                    tp[1],
                    expected,
                    offset,
                )
                await self._rewind(consumer, tp, expected, now_ms())
                return
            log.error(
                "retry %s[%d]: offset %d is gone (retention?); continuing at %d",
                tp[0],
                tp[1],
                expected,
                offset,
            )
        self._rewound.pop(tp, None)
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
        self._expected[(tp.topic, tp.partition)] = tp.offset
        await self._call(consumer.commit, offsets=[tp], asynchronous=False)

    async def wait_assigned(self, timeout_s: float = 30.0) -> None:
        """Wait until the consumer group gave this forwarder partitions (tests, tooling)."""
        deadline = time.monotonic() + timeout_s
        while not self.assigned.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError("retry forwarder got no partitions")
            await asyncio.sleep(0.05)


@app.service
class RetryService(RetryForwarder):
    """The retry group's forwarder over the whole retry topic, started with ``avcc worker retry``
    (consumer group ``avcc-retry``; faust's own consumer stays off: this App has no agents)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _running[:] = [self]
