"""Consumer runtime of the core agent groups.

Each agent's ``async for`` loop hands every event to :meth:`GroupRuntime.process`, which

1. skips retry-topic redeliveries meant for another group,
2. parks the event behind an earlier event of the same key that waits in the retry path,
3. decodes and validates it (bad bytes / schema violations -> DLQ at once),
4. calls the agent's pure handler, retrying retriable failures with in-process backoff,
5. produces the handler's outputs with the core profile and waits for the acks, and only then
   applies the handler's state change (so a crash in between replays to the same outputs,
   which carry deterministic event ids and are deduplicated downstream),
6. forwards a message whose retries are spent to the retry topic, or dead-letters it.

faust commits the input offset only after this returns and the changelog is flushed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import faust
import orjson

from app.platform.contracts import decode_event
from app.platform.faust.effects import Effects, Handler, Outgoing
from app.platform.faust.tables import parking_table
from app.platform.kafka.partitioner import record_key
from app.platform.kafka.producers import EventProducer, Headers
from app.platform.metrics import (
    DEDUP_HITS,
    DLQ_MESSAGES,
    EVENT_AGE,
    EVENTS_IN,
    EVENTS_OUT,
    PROCESSING_SECONDS,
    RETRIES,
    RETRY_TOPIC_MESSAGES,
)
from app.platform.retry_policy import RetryPolicy, classify
from app.platform.settings import get_settings
from app.platform.topics import DLQ, RETRY
from schemas.envelope import Envelope, encode_event
from schemas.system import HEADER_PREFIX, FailureMetadata

__all__ = [
    "HEADER_PARKED",
    "HEADER_RETRY_ROUND",
    "HEADER_TARGET_GROUP",
    "Effects",
    "GroupRuntime",
    "KeyedConcurrency",
    "Outgoing",
    "consume_each",
    "header_value",
    "now_ms",
    "until_done",
]

log = logging.getLogger(__name__)

#: Group a retry-topic redelivery is meant for (other groups skip it).
HEADER_TARGET_GROUP = "avcc-target-group"
#: Rounds the message already made through the retry topic.
HEADER_RETRY_ROUND = "avcc-retry-round"
#: "1" when the message was parked behind an earlier failed event of its key.
HEADER_PARKED = "avcc-parked"


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


def header_value(headers: Any, name: str) -> bytes | None:
    """The value of header ``name`` in a faust/aiokafka header list or mapping."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    for key, value in items:
        if key == name:
            return bytes(value) if value is not None else None
    return None


def _plain_headers(headers: Any) -> list[tuple[str, bytes]]:
    """Original headers without the failure metadata this runtime adds."""
    if not headers:
        return []
    items = headers.items() if isinstance(headers, dict) else headers
    return [(k, bytes(v or b"")) for k, v in items if not k.startswith(HEADER_PREFIX)]


class _ParkingLot:
    """Per-key queue of message ids waiting in the retry path, kept in a changelogged table."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def ids(self, key: bytes) -> list[str]:
        raw = self.table.get(key)
        return list(orjson.loads(raw)) if raw else []

    def _store(self, key: bytes, ids: Sequence[str]) -> None:
        if ids:
            self.table[key] = orjson.dumps(list(ids))
        elif key in self.table:
            del self.table[key]

    def append(self, key: bytes, message_id: str) -> None:
        ids = self.ids(key)
        if message_id not in ids:
            ids.append(message_id)
        self._store(key, ids)

    def remove(self, key: bytes, message_id: str) -> None:
        self._store(key, [i for i in self.ids(key) if i != message_id])


class GroupRuntime:
    """Decode/dedup/retry/park/produce machinery shared by the agents of one group."""

    def __init__(self, group: str, source: str, app: faust.App) -> None:
        self.group = group
        self.source = source
        self.app = app
        self.settings = get_settings()
        self.policy = RetryPolicy.from_settings(self.settings)
        self._producer: EventProducer | None = None
        self._producer_lock = threading.Lock()
        app.task(self._start_producer)

    async def _start_producer(self) -> None:
        """Create and verify the producer at worker start, off the event loop (it blocks)."""
        await asyncio.get_running_loop().run_in_executor(None, lambda: self.producer)

    @property
    def producer(self) -> EventProducer:
        """The core-profile producer (created and verified once; see :meth:`_start_producer`)."""
        with self._producer_lock:
            if self._producer is None:
                producer = EventProducer(self.settings, "core", client_id=f"avcc-{self.group}")
                producer.verify_profile()
                self._producer = producer
            return self._producer

    def close(self) -> None:
        """Flush and close the producer."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def parking_table(self, name: str, partitions: int) -> Any:
        """A changelogged table of parked message ids, co-partitioned with its stream."""
        return parking_table(self.app, name, partitions)

    async def emit(self, outputs: Iterable[Outgoing]) -> None:
        """Produce ``outputs`` with the core profile and wait for every ack."""
        batch = [(o.topic, encode_event(o.envelope), record_key(o.avcc_record_id), None) for o in outputs]
        if not batch:
            return
        await self.producer.send_many(batch)
        for o in outputs:
            EVENTS_OUT.labels(self.group, o.topic.name).inc()

    async def process(
        self,
        event: Any,
        handler: Handler,
        *,
        topic: str | None = None,
        parking: Any | None = None,
    ) -> None:
        """Run ``handler`` on one event under the error policy (see the module docstring).

        ``topic`` is the contract topic when the event arrives through an internal topic;
        ``parking`` a table from :meth:`parking_table` (per-record order while retrying).
        """
        message = event.message
        contract_topic = topic or message.topic
        target = header_value(message.headers, HEADER_TARGET_GROUP)
        if target is not None and target.decode() != self.group:
            return
        redelivered = target is not None
        EVENTS_IN.labels(self.group, contract_topic).inc()
        lot = _ParkingLot(parking) if parking is not None else None
        key = message.key if isinstance(message.key, bytes) else None
        message_id = self._message_id(message, contract_topic)

        if lot is not None and key is not None:
            waiting = lot.ids(key)
            if waiting and not (redelivered and waiting[0] == message_id):
                await self._to_retry_topic(message, contract_topic, None, parked=True)
                lot.append(key, message_id)
                return

        started = time.perf_counter()
        forwarded = await self._run(message, contract_topic, handler)
        PROCESSING_SECONDS.labels(self.group, contract_topic).observe(time.perf_counter() - started)
        if lot is not None and key is not None:
            if forwarded:
                lot.append(key, message_id)
            else:
                lot.remove(key, message_id)

    async def _run(self, message: Any, topic: str, handler: Handler) -> bool:
        """Decode and handle; returns True when the message went to the retry topic."""
        try:
            envelope = decode_event(topic, message.value)
        except Exception as exc:  # undecodable or invalid: the policy dead-letters it
            if classify(exc) == "retriable":
                raise
            await self.dead_letter(message, topic, exc, attempt=1)
            return False
        EVENT_AGE.labels(self.group, topic).observe(max(0.0, (now_ms() - envelope.timestamp) / 1000))
        attempt = 0
        first_failure = 0
        while True:
            try:
                effects = await handler(envelope)
                if effects.duplicate:
                    DEDUP_HITS.labels(self.group, topic).inc()
                    return False
                await self.emit(effects.outputs)
                if effects.apply is not None:
                    effects.apply()
                return False
            except Exception as exc:  # the error policy decides; nothing is swallowed silently
                attempt += 1
                first_failure = first_failure or now_ms()
                self._log_failure(message, topic, envelope, exc, attempt)
                rounds = int(header_value(message.headers, HEADER_RETRY_ROUND) or b"0")
                decision = self.policy.decide(exc, attempt, rounds)
                delay = self.policy.delay_before(attempt)
                if decision == "retry_in_process" and delay is not None:
                    RETRIES.labels(self.group, topic).inc()
                    await asyncio.sleep(delay)
                    continue
                if decision == "retry_topic":
                    await self._to_retry_topic(
                        message, topic, exc, attempt=attempt, first_failure=first_failure, envelope=envelope
                    )
                    return True
                await self.dead_letter(message, topic, exc, attempt, first_failure, envelope)
                return False

    def _log_failure(
        self, message: Any, topic: str, envelope: Envelope[Any], exc: Exception, attempt: int
    ) -> None:
        log.warning(
            "handler failed group=%s topic=%s partition=%s offset=%s event_id=%s attempt=%d error=%s: %s",
            self.group,
            topic,
            message.partition,
            message.offset,
            envelope.event_id,
            attempt,
            type(exc).__name__,
            exc,
        )

    def _message_id(self, message: Any, topic: str) -> str:
        original = header_value(message.headers, "avcc-original-offset")
        if original is not None:
            part = (header_value(message.headers, "avcc-original-partition") or b"?").decode()
            orig_topic = (header_value(message.headers, "avcc-original-topic") or topic.encode()).decode()
            return f"{orig_topic}:{part}:{original.decode()}"
        return f"{message.topic}:{message.partition}:{message.offset}"

    def _metadata(
        self,
        message: Any,
        topic: str,
        exc: BaseException | None,
        attempt: int,
        first_failure: int,
        envelope: Envelope[Any] | None,
        not_before: int | None = None,
    ) -> FailureMetadata:
        now = now_ms()
        previous = header_value(message.headers, "avcc-original-offset") is not None
        if previous:
            base = FailureMetadata.from_headers(message.headers)
            return base.model_copy(
                update={
                    "attempt": base.attempt + attempt,
                    "last_failure_ms": now,
                    "error_class": _qualname(exc) if exc else base.error_class,
                    "error_message": str(exc) if exc else base.error_message,
                    "not_before_ms": not_before,
                    "stacktrace": _stack(exc) if exc else base.stacktrace,
                }
            )
        key = message.key if isinstance(message.key, bytes) else None
        return FailureMetadata(
            original_topic=message.topic,
            original_partition=message.partition,
            original_offset=message.offset,
            original_timestamp_ms=int((message.timestamp or 0) * 1000) or -1,
            original_key=key.decode(errors="replace") if key is not None else None,
            consumer_group=self.group,
            attempt=max(1, attempt),
            first_failure_ms=first_failure or now,
            last_failure_ms=now,
            error_class=_qualname(exc) if exc else "parked",
            error_message=str(exc) if exc else "parked behind an earlier event of the same key",
            not_before_ms=not_before,
            stacktrace=_stack(exc) if exc else None,
            event_id=str(envelope.event_id) if envelope is not None else None,
            reinjected_count=int(header_value(message.headers, "avcc-reinjected-count") or b"0"),
        )

    async def _to_retry_topic(
        self,
        message: Any,
        topic: str,
        exc: BaseException | None,
        *,
        parked: bool = False,
        attempt: int = 0,
        first_failure: int = 0,
        envelope: Envelope[Any] | None = None,
    ) -> None:
        rounds = int(header_value(message.headers, HEADER_RETRY_ROUND) or b"0")
        # a parked message is due at once: it still waits behind the failed one in its partition
        not_before = now_ms() if parked else now_ms() + int(self.policy.topic_delay_s * 1000)
        meta = self._metadata(message, topic, exc, attempt, first_failure, envelope, not_before)
        headers: Headers = [
            *_plain_headers(message.headers),
            *meta.to_headers(),
            (HEADER_TARGET_GROUP, self.group.encode()),
            (HEADER_RETRY_ROUND, str(rounds if parked else rounds + 1).encode()),
            (HEADER_PARKED, b"1" if parked else b"0"),
        ]
        await self.producer.send(RETRY, message.value or b"", message.key, headers)
        RETRY_TOPIC_MESSAGES.labels(self.group, topic, "parked" if parked else "failed").inc()

    async def dead_letter(
        self,
        message: Any,
        topic: str,
        exc: BaseException,
        attempt: int,
        first_failure: int = 0,
        envelope: Envelope[Any] | None = None,
    ) -> None:
        """Send ``message`` to the DLQ with its failure metadata and stack trace."""
        meta = self._metadata(message, topic, exc, attempt, first_failure, envelope)
        headers: Headers = [*_plain_headers(message.headers), *meta.to_headers()]
        await self.producer.send(DLQ, message.value or b"", message.key, headers)
        DLQ_MESSAGES.labels(self.group, topic, meta.error_class).inc()
        log.error(
            "dead-lettered group=%s topic=%s partition=%s offset=%s event_id=%s error=%s: %s",
            self.group,
            meta.original_topic,
            meta.original_partition,
            meta.original_offset,
            meta.event_id,
            meta.error_class,
            meta.error_message,
        )


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


def _stack(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


#: Backoff bounds (seconds) of an event whose processing failed outside the error policy.
UNDONE_RETRY_S: tuple[float, float] = (0.5, 10.0)


async def until_done(work: Callable[[Any], Awaitable[None]], event: Any) -> None:
    """Run ``work(event)`` until it returns. A failure outside the error policy (the broker
    unreachable even for the retry topic or the DLQ, a relay that could not produce) is retried
    in place with backoff, so the event is neither acked unprocessed nor overtaken by later
    events of its key; the stall watchdog restarts a worker stuck here for ``AVCC_WORKER_STALL_S``."""
    delay = UNDONE_RETRY_S[0]
    while True:
        try:
            await work(event)
            return
        except Exception:
            log.exception("processing failed outside the error policy; the event is retried in %.1f s", delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, UNDONE_RETRY_S[1])


async def consume_each(stream: Any, work: Callable[[Any], Awaitable[None]]) -> None:
    """Consume ``stream`` one event at a time, acking each only once ``work`` is done with it.

    faust acks the event an agent was on when its loop raised or was cancelled (the stream's
    ``finally``), which let a failed produce commit an event nobody processed (seen in the
    scale-out failover: a record issued without its ``review.task.finished`` ever applied)."""
    quiet = stream.noack()
    async for event in quiet.events():
        await until_done(work, event)
        await quiet.ack(event)


class KeyedConcurrency:
    """Processes a stream's events concurrently while keeping per-key order.

    Events of one key run one after the other; events of different keys overlap, up to
    ``limit`` at once. Each event is acked only once its processing finished, so faust commits
    an offset only when every event before it in the partition is done (at-least-once holds).
    Used where one event waits on something slow but batchable (a chain block).
    """

    def __init__(self, limit: int) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._tails: dict[bytes | None, asyncio.Task[None]] = {}

    async def run(self, stream: Any, work: Callable[[Any], Awaitable[None]]) -> None:
        """Consume ``stream`` (created with ``.noack()``) until it ends."""
        async for event in stream.events():
            await self._slots.acquire()
            key = event.message.key
            previous = self._tails.get(key)
            task = asyncio.create_task(self._one(stream, event, work, previous))
            self._tails[key] = task
            task.add_done_callback(functools.partial(self._forget, key))

    async def _one(
        self, stream: Any, event: Any, work: Callable[[Any], Awaitable[None]], previous: Any
    ) -> None:
        try:
            if previous is not None:
                await asyncio.wait([previous])
            await until_done(work, event)
            await stream.ack(event)
        finally:
            self._slots.release()

    def _forget(self, key: bytes | None, task: asyncio.Task[None]) -> None:
        if self._tails.get(key) is task:
            del self._tails[key]
