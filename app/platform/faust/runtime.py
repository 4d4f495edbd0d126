"""The error policy and per-event path of the core agent groups, run in batches.

Each agent hands its stream to :meth:`GroupRuntime.consume`, which runs it in batches that own
their offsets (:mod:`app.platform.faust.batches`). Every event of a batch goes through
:meth:`GroupRuntime.processor`, which

1. skips retry-topic redeliveries meant for another group,
2. parks the event behind an earlier event of the same key that waits in the retry path,
3. decodes and validates it (bad bytes / schema violations -> DLQ at once),
4. calls the agent's pure handler, retrying retriable failures with in-process backoff,
5. adds the handler's outputs to the batch and stages its table writes (the batch produces all
   outputs at once, waits for the acks and only then makes the writes durable, so a crash in
   between replays to the same outputs, which carry deterministic event ids and are
   deduplicated downstream),
6. forwards a message whose retries are spent to the retry topic, or dead-letters it (with the
   batch's outputs).

The batch's input offsets are committed only once all of that is durable.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import faust

from app.platform.contracts import decode_event
from app.platform.faust import internals
from app.platform.faust.batches import Batch, BatchAgent, Process, source_topic
from app.platform.faust.effects import Effects, Handler, Outgoing
from app.platform.faust.tables import ModelTable, ParkedIds, Write, parking_table
from app.platform.kafka.partitioner import record_key
from app.platform.kafka.producers import EventProducer, Headers, Outbound
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
    "Batch",
    "Effects",
    "GroupRuntime",
    "Outgoing",
    "header_value",
    "now_ms",
    "source_topic",
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

    def __init__(self, table: ModelTable[ParkedIds]) -> None:
        self.table = table

    def ids(self, key: str) -> list[str]:
        parked = self.table.get(key)
        return list(parked.root) if parked is not None else []

    def _store(self, key: str, ids: Sequence[str]) -> Write:
        return self.table.write(key, ParkedIds(list(ids)) if ids else None)

    def append(self, key: str, message_id: str) -> Write:
        ids = self.ids(key)
        if message_id not in ids:
            ids.append(message_id)
        return self._store(key, ids)

    def remove(self, key: str, message_id: str) -> Write | None:
        ids = self.ids(key)
        if message_id not in ids:
            return None
        return self._store(key, [i for i in ids if i != message_id])


class GroupRuntime:
    """Decode/dedup/retry/park machinery and the batch agents of one group."""

    def __init__(self, group: str, source: str, app: faust.App) -> None:
        self.group = group
        self.source = source
        self.app = app
        self.settings = get_settings()
        self.policy = RetryPolicy.from_settings(self.settings)
        self.agents: list[BatchAgent] = []
        self._producer: EventProducer | None = None
        self._producer_lock = threading.Lock()
        app.task(self._start_producer)
        app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]  # mode's typing
        app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]

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

    def parking_table(self, name: str, partitions: int) -> ModelTable[ParkedIds]:
        """A changelogged table of parked message ids, co-partitioned with its stream."""
        return parking_table(self.app, name, partitions)

    def outbound(self, outgoing: Outgoing) -> Outbound:
        """The message of ``outgoing`` (keyed by its record), counted as produced."""
        EVENTS_OUT.labels(self.group, outgoing.topic.name).inc()
        return Outbound(outgoing.topic, encode_event(outgoing.envelope), record_key(outgoing.avcc_record_id))

    async def emit(self, outputs: Iterable[Outgoing]) -> None:
        """Produce ``outputs`` with the core profile and wait for every ack (HTTP routes)."""
        await self.producer.send_batch([self.outbound(o) for o in outputs])

    async def _on_assigned(self, app: Any, assigned: set[Any], **_: Any) -> None:
        """faust's ``on_partitions_assigned`` signal (the consumer runs): fetch in batches."""
        internals.tune_fetches(
            app, self.settings.kafka_fetch_min_bytes, self.settings.kafka_fetch_max_wait_ms
        )

    async def _on_revoked(self, app: Any, revoked: set[Any], **_: Any) -> None:
        """faust's ``on_partitions_revoked`` signal: every agent finishes its batch and commits."""
        await asyncio.gather(*(agent.revoke(revoked) for agent in self.agents))

    async def consume(
        self,
        stream: Any,
        handler: Handler,
        *,
        contract_topics: Mapping[str, str] | None = None,
        parking: ModelTable[ParkedIds] | None = None,
        concurrency: int | None = None,
    ) -> None:
        """Run an agent's ``stream`` of envelopes through ``handler`` in batches (see
        :meth:`processor`) until the worker stops; ``concurrency``: keys processed at once."""
        process = self.processor(handler, contract_topics=contract_topics, parking=parking)
        await self.consume_batches(stream, process, concurrency=concurrency)

    async def consume_batches(self, stream: Any, process: Process, *, concurrency: int | None = None) -> None:
        """Run an agent's ``stream`` in batches that own their offsets, each event through
        ``process`` (:class:`~app.platform.faust.batches.BatchAgent`)."""
        topics = [str(t) for t in stream.channel.topics]
        name = f"{self.group}:{stream.channel.topics[0]}"
        agent = BatchAgent(
            self.app,
            name,
            topics,
            process,
            lambda: self.producer,
            concurrency=concurrency,
            max_events=self.settings.batch_max_events,
            within_s=self.settings.batch_wait_ms / 1000,
            commit_interval_s=self.settings.commit_interval_ms / 1000,
        )
        self.agents.append(agent)
        try:
            await agent.run(stream)
        finally:
            self.agents.remove(agent)

    def processor(
        self,
        handler: Handler,
        *,
        contract_topics: Mapping[str, str] | None = None,
        parking: ModelTable[ParkedIds] | None = None,
    ) -> Process:
        """The per-event path of the module docstring for ``handler``.

        ``contract_topics`` maps an internal topic to the contract topic its events follow;
        ``parking`` a table from :meth:`parking_table` (per-record order while retrying).
        """
        renamed = dict(contract_topics or {})
        lot = _ParkingLot(parking) if parking is not None else None

        async def process(event: Any, batch: Batch) -> None:
            message = event.message
            contract_topic = renamed.get(message.topic, message.topic)
            target = header_value(message.headers, HEADER_TARGET_GROUP)
            if target is not None and target.decode() != self.group:
                return
            redelivered = target is not None
            EVENTS_IN.labels(self.group, contract_topic).inc()
            key = message.key.decode(errors="replace") if isinstance(message.key, bytes) else None
            message_id = self._message_id(message, contract_topic)
            if lot is not None and key is not None:
                waiting = lot.ids(key)
                if waiting and not (redelivered and waiting[0] == message_id):
                    batch.output(self._to_retry_topic(message, contract_topic, None, parked=True))
                    batch.stage([lot.append(key, message_id)], event)
                    return
            started = time.perf_counter()
            forwarded = await self._run(event, contract_topic, handler, batch)
            PROCESSING_SECONDS.labels(self.group, contract_topic).observe(time.perf_counter() - started)
            if lot is not None and key is not None:
                write = lot.append(key, message_id) if forwarded else lot.remove(key, message_id)
                if write is not None:
                    batch.stage([write], event)

        return process

    async def _run(self, event: Any, topic: str, handler: Handler, batch: Batch) -> bool:
        """Decode and handle; returns True when the message went to the retry topic."""
        message = event.message
        try:
            envelope = decode_event(topic, message.value)
        except Exception as exc:  # undecodable or invalid: the policy dead-letters it
            if classify(exc) == "retriable":
                raise
            batch.output(self.dead_letter(message, topic, exc, attempt=1))
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
                for outgoing in effects.outputs:
                    batch.output(self.outbound(outgoing))
                batch.stage(effects.writes, event)
                if effects.apply is not None:
                    batch.after.append(effects.apply)
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
                    batch.output(
                        self._to_retry_topic(
                            message,
                            topic,
                            exc,
                            attempt=attempt,
                            first_failure=first_failure,
                            envelope=envelope,
                        )
                    )
                    return True
                batch.output(self.dead_letter(message, topic, exc, attempt, first_failure, envelope))
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

    def _to_retry_topic(
        self,
        message: Any,
        topic: str,
        exc: BaseException | None,
        *,
        parked: bool = False,
        attempt: int = 0,
        first_failure: int = 0,
        envelope: Envelope[Any] | None = None,
    ) -> Outbound:
        """The retry-topic message of ``message`` (``parked``: behind an earlier failed one)."""
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
        RETRY_TOPIC_MESSAGES.labels(self.group, topic, "parked" if parked else "failed").inc()
        return Outbound(RETRY, message.value or b"", message.key, headers)

    def dead_letter(
        self,
        message: Any,
        topic: str,
        exc: BaseException,
        attempt: int,
        first_failure: int = 0,
        envelope: Envelope[Any] | None = None,
    ) -> Outbound:
        """The DLQ message of ``message``, with its failure metadata and stack trace."""
        meta = self._metadata(message, topic, exc, attempt, first_failure, envelope)
        headers: Headers = [*_plain_headers(message.headers), *meta.to_headers()]
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
        return Outbound(DLQ, message.value or b"", message.key, headers)


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


def _stack(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))
