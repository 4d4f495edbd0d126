"""Sink group (clickhouse-sink): playback events and anomalies from Kafka into ClickHouse in batches.

faust costs ~180 us per event, so the sink does not iterate through faust: a ``mode.Service``
registered on the group's faust App owns a confluent-kafka consumer and runs a blocking batch
loop in a dedicated thread (the event loop stays free for the web views)::

    consume(10k) ... until 50k messages or 1 s  ->  orjson + hand-written contract check
    -> columnar lists -> one INSERT per table -> DLQ sends acknowledged -> commit offsets

Guarantees:

* **Nothing is lost**: offsets are committed only after ClickHouse acknowledged the insert
  and every dead letter of the batch was acknowledged (core profile, acks=all).
* **Duplicates never count**: tables are ``ReplacingMergeTree`` on the event id, and every
  query deduplicates by id, so redelivery (crash, rebalance) cannot inflate results.
* **Bad input never blocks**: undecodable or contract-breaking messages go to the DLQ at once
  with ``FailureMetadata`` headers; the rest of the batch is stored.
* **Outages heal by themselves**: when an insert fails the batch is kept, the assigned
  partitions are paused (memory stays bounded, ``consume()`` keeps the member in the group)
  and the insert is retried with capped exponential backoff; partitions resume once it
  succeeds.
* **Rebalance**: the uncommitted in-memory batch is dropped on revoke (eager assignment: every
  partition is revoked), its messages are redelivered to the new owner.

Run: ``faust -A agents.sink worker -l info --web-port 6072`` (or ``avcc worker sink``). Views:
``GET /v1/playback/stats?avcc_code=&from_ms=&to_ms=`` and
``GET /v1/playback/anomalies?avcc_code=&rule=&from_ms=&to_ms=&limit=`` (HMAC-signed).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import methodcaller
from typing import Any, Final

import faust
import mode
import orjson
from aiohttp import web
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.errors import NON_RETRIABLE, DependencyUnavailable, RetriableError
from app.platform.faust.app import consumer_group_id, get_app
from app.platform.http.auth import require_hmac
from app.platform.http.responses import json_error, json_response
from app.platform.http.views import install_common_views
from app.platform.kafka.producers import EventProducer
from app.platform.metrics import (
    CH_BATCH_ROWS,
    CH_INSERT_FAILURES,
    CH_INSERT_SECONDS,
    DEDUP_HITS,
    DLQ_MESSAGES,
    EVENT_AGE,
    EVENTS_IN,
    PROCESSING_SECONDS,
    SINK_COMMIT_FAILURES,
    SINK_DROPPED_ON_REVOKE,
    SINK_PAUSED,
    SINK_PENDING_MESSAGES,
    SINK_ROWS_WRITTEN,
)
from app.platform.settings import Settings, get_settings
from app.platform.topics import ANOMALY, DLQ, PLAYBACK_EVENT
from app.playback.sink.clickhouse import ChdbBackend, ClickHouseBackend, connect
from app.playback.sink.store import (
    ANOMALY_INSERT_COLUMNS,
    ANOMALY_TABLE,
    PLAYBACK_INSERT_COLUMNS,
    PLAYBACK_TABLE,
    AnomalyColumns,
    ParsedPlayback,
    PlaybackColumns,
    ensure_schema,
    list_anomalies,
    parse_playback,
    playback_row,
    playback_stats,
)
from schemas.envelope import decode_as
from schemas.playback import PlaybackEvent
from schemas.system import AnomalyDetected, FailureMetadata
from schemas.types import MAX_EPOCH_MS

__all__ = [
    "GROUP",
    "DeadLetter",
    "PlaybackAnomaliesView",
    "PlaybackStatsView",
    "SinkConfig",
    "SinkLoop",
    "SinkRunner",
    "SinkService",
    "SinkStats",
    "SinkTopics",
    "app",
    "consumer_config",
]

log = logging.getLogger(__name__)

GROUP: Final = "sink"
STATS_ROUTE: Final = "/v1/playback/stats"
ANOMALIES_ROUTE: Final = "/v1/playback/anomalies"


class SinkConfig(BaseSettings):
    """Knobs of the sink. Each field maps to ``AVCC_SINK_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_SINK_", frozen=True, extra="ignore")

    batch_max_rows: int = Field(
        50_000, ge=1, description="Messages per batch (one insert per table); bounds memory."
    )
    batch_max_seconds: float = Field(
        1.0, gt=0, description="Longest time a message waits in a batch before the insert."
    )
    consume_chunk: int = Field(10_000, ge=1, description="Messages asked of one consume() call.")
    backoff_initial_s: float = Field(0.5, gt=0, description="First wait after a failed insert.")
    backoff_max_s: float = Field(15.0, gt=0, description="Cap of the insert retry backoff.")
    dlq_timeout_s: float = Field(30.0, gt=0, description="Wait for DLQ acknowledgements.")
    age_sample_every: int = Field(
        64, ge=1, description="Observe the event-age histogram for one row in N (cost control)."
    )
    gc_gen0_threshold: int = Field(
        50_000,
        ge=0,
        description="Gen-0 threshold of Python's GC set by a starting sink (process-wide; 0 keeps "
        "Python's 700). Batches allocate ~10 objects per event; frequent young collections cost "
        "~10% of the sink's CPU.",
    )
    group_id: str | None = Field(
        None, description="Consumer group override (default: the sink group's, avcc-sink)."
    )
    playback_topic: str | None = Field(None, description="Topic override (tests; default: plan).")
    anomaly_topic: str | None = Field(None, description="Topic override (tests; default: plan).")
    dlq_topic: str | None = Field(None, description="Topic override (tests; default: plan).")


@dataclass(frozen=True, slots=True)
class SinkTopics:
    """Topics the sink reads (playback, anomaly) and dead-letters to."""

    playback: str = PLAYBACK_EVENT.name
    anomaly: str = ANOMALY.name
    dlq: str = DLQ.name

    @classmethod
    def from_config(cls, config: SinkConfig) -> SinkTopics:
        """The plan's topics, with the config's overrides."""
        return cls(
            config.playback_topic or PLAYBACK_EVENT.name,
            config.anomaly_topic or ANOMALY.name,
            config.dlq_topic or DLQ.name,
        )


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


@dataclass(slots=True)
class SinkStats:
    """Counters of one :class:`SinkLoop` (for tests, the bench and logs)."""

    consumed: int = 0
    rows_written: int = 0
    anomalies_written: int = 0
    dead_lettered: int = 0
    duplicates_in_batch: int = 0
    batches: int = 0
    insert_failures: int = 0
    commits: int = 0
    dropped_on_revoke: int = 0
    paused: bool = False
    cpu_seconds: float = 0.0


class _Batch:
    """Messages consumed since the last commit, already in insertable form."""

    __slots__ = (
        "anomalies",
        "anomalies_done",
        "dead",
        "first",
        "last",
        "messages",
        "per_topic",
        "playback",
        "playback_done",
        "started",
    )

    def __init__(self) -> None:
        self.playback = PlaybackColumns()
        self.anomalies = AnomalyColumns()
        self.dead: list[DeadLetter] = []
        #: topic -> partition -> first / last offset consumed into this batch.
        self.first: dict[str, dict[int, int]] = {}
        self.last: dict[str, dict[int, int]] = {}
        self.per_topic: dict[str, int] = {}
        self.messages = 0
        self.started = 0.0
        self.playback_done = False
        self.anomalies_done = False

    def commit_offsets(self) -> list[TopicPartition]:
        """Next offset of every partition the batch read (what the commit stores)."""
        return [
            TopicPartition(topic, partition, last + 1)
            for topic, ends in self.last.items()
            for partition, last in ends.items()
        ]

    def dedup_token(self, table: str, group: str) -> str:
        """Same messages -> same token: a retried insert whose ack was lost is dropped server-side."""
        spans = ";".join(
            f"{topic}/{partition}/{self.first[topic][partition]}-{last}"
            for topic, ends in sorted(self.last.items())
            for partition, last in sorted(ends.items())
        )
        # The insert columns are part of the key: a new code version never reuses an old token.
        version = ",".join(PLAYBACK_INSERT_COLUMNS if table == PLAYBACK_TABLE else ANOMALY_INSERT_COLUMNS)
        return hashlib.sha256(f"{group}|{table}|{version}|{spans}".encode()).hexdigest()


def consumer_config(settings: Settings, group_id: str) -> dict[str, Any]:
    """librdkafka configuration of the sink consumer (security settings from ``settings``)."""
    session_ms = settings.kafka_session_timeout_ms
    conf: dict[str, Any] = settings.kafka_client_config()
    conf.update(
        {
            "group.id": group_id,
            "client.id": "avcc-sink",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(100, min(3000, session_ms // 3)),
            # Eager protocol: a rebalance revokes every partition, so dropping the whole
            # uncommitted batch on revoke never skips a partition we keep.
            "partition.assignment.strategy": "roundrobin",
            "enable.partition.eof": False,
            # Prefetch bound (per consumer): with the batch it bounds the sink's memory.
            "queued.max.messages.kbytes": 32 * 1024,
        }
    )
    return conf


class SinkLoop:
    """The blocking consume -> insert -> commit loop (run it in its own thread with :meth:`run`)."""

    def __init__(
        self,
        settings: Settings,
        backend: ClickHouseBackend,
        dead_letter: DeadLetterSender,
        *,
        config: SinkConfig | None = None,
        topics: SinkTopics | None = None,
        group_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.config = config if config is not None else SinkConfig()
        self.topics = topics if topics is not None else SinkTopics.from_config(self.config)
        self.group_id = group_id or self.config.group_id or consumer_group_id(GROUP)
        self._dead_letter = dead_letter
        self.stats = SinkStats()
        self._batch = _Batch()
        self._paused = False
        self._consumer: Any = None
        self._warned_validator = False
        self._assignment: tuple[tuple[str, int], ...] = ()

    def assignment(self) -> list[tuple[str, int]]:
        """``(topic, partition)`` pairs assigned to this sink (safe to call from any thread)."""
        return list(self._assignment)

    # --- lifecycle --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set; a final batch is stored if ClickHouse is up."""
        cpu0 = time.thread_time()
        try:
            if not self._ensure_schema(stop):
                return
            self._consumer = Consumer(consumer_config(self.settings, self.group_id))
            self._consumer.subscribe(
                [self.topics.playback, self.topics.anomaly],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_revoke,
            )
            log.info(
                "sink consuming %s, %s as %s into %s",
                self.topics.playback,
                self.topics.anomaly,
                self.group_id,
                self.backend.description,
            )
            self._loop(stop)
        finally:
            self.stats.cpu_seconds += time.thread_time() - cpu0
            self._close()

    def _ensure_schema(self, stop: threading.Event) -> bool:
        delay = self.config.backoff_initial_s
        while not stop.is_set():
            try:
                report = ensure_schema(self.backend)
                if report.created or report.added_columns:
                    log.info("ClickHouse schema: created %s, added %s", report.created, report.added_columns)
                return True
            except Exception as exc:
                log.warning(
                    "ClickHouse schema not ready (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay
                )
                stop.wait(delay)
                delay = min(delay * 2, self.config.backoff_max_s)
        return False

    def _repair_schema(self) -> None:
        """After a non-transient insert error: a dropped table or column is recreated."""
        try:
            report = ensure_schema(self.backend)
        except Exception as exc:
            log.warning("schema check after a failed insert failed too: %s", exc)
            return
        if report.created or report.added_columns:
            log.warning(
                "ClickHouse schema repaired: created %s, added %s", report.created, report.added_columns
            )

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.warning("sink consumer close failed: %s", exc)
        self._assignment = ()
        SINK_PAUSED.labels(GROUP).set(0)
        SINK_PENDING_MESSAGES.labels(GROUP).set(0)

    def _loop(self, stop: threading.Event) -> None:
        config = self.config
        while not stop.is_set():
            batch = self._batch
            if batch.messages:
                timeout = max(0.0, batch.started + config.batch_max_seconds - time.monotonic())
            else:
                timeout = min(config.batch_max_seconds, 0.5)
            self._consume(timeout)
            if self._batch is not batch or not batch.messages:
                continue
            due = batch.messages >= config.batch_max_rows or (
                time.monotonic() - batch.started >= config.batch_max_seconds
            )
            if due:
                self._flush_until_done(batch, stop)
        batch = self._batch
        if batch.messages and not self._paused:
            try:
                self._flush(batch)
            except Exception as exc:
                log.warning("final batch not stored (%s); it will be redelivered", exc)

    # --- consuming --------------------------------------------------------------------------

    def _consume(self, timeout: float) -> None:
        batch = self._batch
        want = max(1, min(self.config.consume_chunk, self.config.batch_max_rows - batch.messages))
        messages = self._consumer.consume(num_messages=want, timeout=timeout)
        batch = self._batch  # a rebalance inside consume() may have replaced it
        if messages:
            self._add(batch, messages)

    def _add(self, batch: _Batch, messages: list[Message]) -> None:
        started = time.perf_counter()
        playback_topic = self.topics.playback
        anomaly_topic = self.topics.anomaly
        total = len(messages)
        if not total:
            return
        if not batch.messages:
            batch.started = time.monotonic()
        get = _getters(messages)
        if (
            list(map(get.topic, messages)).count(playback_topic) == total
            and list(map(get.error, messages)).count(None) == total
        ):
            playback, n_anomaly, n_other = messages, 0, 0  # the usual chunk: playback events only
        else:
            playback, n_anomaly, n_other = self._sort_out(batch, messages)
        if playback:
            self._add_playback(batch, playback, get)
        n_playback = len(playback)
        count = n_playback + n_anomaly + n_other
        if count:
            per_topic = batch.per_topic
            batch.messages += count
            self.stats.consumed += count
            if n_playback:
                per_topic[playback_topic] = per_topic.get(playback_topic, 0) + n_playback
            if n_anomaly:
                per_topic[anomaly_topic] = per_topic.get(anomaly_topic, 0) + n_anomaly
            SINK_PENDING_MESSAGES.labels(GROUP).set(batch.messages)
            PROCESSING_SECONDS.labels(GROUP, playback_topic).observe(time.perf_counter() - started)

    def _sort_out(self, batch: _Batch, messages: list[Message]) -> tuple[list[Message], int, int]:
        """Consumer errors and other topics handled here; returns (playback messages, anomalies, others)."""
        playback_topic = self.topics.playback
        anomaly_topic = self.topics.anomaly
        playback: list[Message] = []
        n_anomaly = n_other = 0
        for msg in messages:
            if msg.error() is not None:
                self._consumer_error(msg)
                continue
            topic = msg.topic()
            if topic == playback_topic:
                playback.append(msg)
                continue
            partition = msg.partition()
            offset = msg.offset()
            batch.last.setdefault(topic, {})[partition] = offset
            batch.first.setdefault(topic, {}).setdefault(partition, offset)
            if topic == anomaly_topic:
                n_anomaly += 1
                self._anomaly(batch, msg)
            else:
                n_other += 1
                log.warning("sink got a message of unexpected topic %s; skipped", topic)
        return playback, n_anomaly, n_other

    def _add_playback(self, batch: _Batch, messages: list[Message], get: _Getters) -> None:
        """Playback messages into the batch, :data:`_DECODE_CHUNK` at a time: column-wise when the
        whole slice is valid (the usual case), else one by one (the schema explains refusals)."""
        playback_topic = self.topics.playback
        partitions = list(map(get.partition, messages))
        offsets = list(map(get.offset, messages))
        # Offsets ascend within a partition: the last pair per partition wins, first by reversal.
        batch.last.setdefault(playback_topic, {}).update(zip(partitions, offsets, strict=True))
        pb_first = batch.first.setdefault(playback_topic, {})
        for partition, offset in dict(zip(reversed(partitions), reversed(offsets), strict=True)).items():
            pb_first.setdefault(partition, offset)
        values = list(map(get.value, messages))
        block = batch.playback
        add_documents = block.add_documents
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError
        # Slices small enough for the decoded documents to stay in the CPU cache while they are
        # checked column by column (measured: 512 -> ~3 us/event, 10k -> ~7 us/event).
        for start in range(0, len(values), _DECODE_CHUNK):
            end = start + _DECODE_CHUNK
            documents: list[Any] | None
            try:
                documents = list(map(loads, values[start:end]))
            except (decode_error, TypeError):
                documents = None
            if documents is not None and add_documents(documents, partitions[start:end], offsets[start:end]):
                continue
            for index in range(start, min(end, len(values))):
                row: ParsedPlayback | None
                try:
                    row = parse_playback(
                        documents[index - start] if documents is not None else loads(values[index])
                    )
                except (decode_error, TypeError):
                    row = None
                if row is None:
                    row = self._slow_playback(batch, messages[index])
                    if row is None:
                        continue
                block.add(row, partitions[index], offsets[index])

    def _consumer_error(self, msg: Message) -> None:
        err = msg.error()
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.fatal():
            raise KafkaException(err)
        log.warning("sink consumer error on %s[%s]: %s", msg.topic(), msg.partition(), err.str())

    def _slow_playback(self, batch: _Batch, msg: Message) -> ParsedPlayback | None:
        """The fast check refused ``msg``: let the schema decide and explain (DLQ), or accept."""
        try:
            envelope = decode_as(PlaybackEvent, msg.value())
        except NON_RETRIABLE as exc:
            self._reject(batch, msg, exc)
            return None
        if not self._warned_validator:
            self._warned_validator = True
            log.error(
                "fast playback validator refused a message the schema accepts (offset %s)", msg.offset()
            )
        return playback_row(envelope)

    def _anomaly(self, batch: _Batch, msg: Message) -> None:
        try:
            envelope = decode_as(AnomalyDetected, msg.value())
        except NON_RETRIABLE as exc:
            self._reject(batch, msg, exc)
            return
        batch.anomalies.add(envelope, msg.partition() or 0, msg.offset() or 0)

    def _reject(self, batch: _Batch, msg: Message, exc: Exception) -> None:
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
            consumer_group=self.group_id,
            attempt=1,
            first_failure_ms=now_ms,
            last_failure_ms=now_ms,
            error_class=error_class,
            error_message=str(exc) or type(exc).__name__,
            event_id=_event_id_of(value),
        )
        batch.dead.append(
            DeadLetter(self.topics.dlq, value, key, meta.to_headers(), msg.topic() or "?", error_class)
        )
        log.info(
            "dead-lettering %s[%s]@%s: %s",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            meta.error_message[:200],
        )

    # --- storing ----------------------------------------------------------------------------

    def _flush(self, batch: _Batch) -> None:
        """Dead letters, then inserts, then the commit; raises if any step failed (kept state)."""
        pending = [d for d in batch.dead if not d.sent]
        if pending:
            self._dead_letter(pending)
            for letter in pending:
                letter.sent = True
                DLQ_MESSAGES.labels(GROUP, letter.source_topic, letter.error_class).inc()
            self.stats.dead_lettered += len(pending)
        if not batch.anomalies_done and len(batch.anomalies):
            self._insert(
                ANOMALY_TABLE, batch.anomalies.insert, batch.dedup_token(ANOMALY_TABLE, self.group_id)
            )
            self.stats.anomalies_written += len(batch.anomalies)
        batch.anomalies_done = True
        if not batch.playback_done and len(batch.playback):
            self._insert(
                PLAYBACK_TABLE, batch.playback.insert, batch.dedup_token(PLAYBACK_TABLE, self.group_id)
            )
            rows = len(batch.playback)
            self.stats.rows_written += rows
            self._observe_ages(batch.playback)
        batch.playback_done = True
        if batch.playback.duplicates:
            DEDUP_HITS.labels(GROUP, self.topics.playback).inc(batch.playback.duplicates)
            self.stats.duplicates_in_batch += batch.playback.duplicates
            batch.playback.duplicates = 0
        self._commit(batch)
        for topic, count in batch.per_topic.items():
            EVENTS_IN.labels(GROUP, topic).inc(count)
        batch.per_topic.clear()
        self.stats.batches += 1

    def _insert(
        self, table: str, insert: Callable[[ClickHouseBackend, str | None], None], token: str
    ) -> None:
        started = time.perf_counter()
        try:
            insert(self.backend, token)
        except Exception:
            CH_INSERT_FAILURES.labels(table).inc()
            self.stats.insert_failures += 1
            raise
        CH_INSERT_SECONDS.labels(table).observe(time.perf_counter() - started)

    def _observe_ages(self, block: PlaybackColumns) -> None:
        rows = len(block)
        CH_BATCH_ROWS.labels(PLAYBACK_TABLE).observe(rows)
        SINK_ROWS_WRITTEN.labels(PLAYBACK_TABLE).inc(rows)
        now_ms = time.time_ns() // 1_000_000
        histogram = EVENT_AGE.labels(GROUP, self.topics.playback)
        for ts_ms in block.timestamps_ms()[:: self.config.age_sample_every]:
            histogram.observe(max(0.0, (now_ms - ts_ms) / 1000))

    def _commit(self, batch: _Batch) -> None:
        offsets = batch.commit_offsets()
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
            self.stats.commits += 1
        except KafkaException as exc:
            # The rows are stored: a lost commit only means redelivery, which deduplicates.
            SINK_COMMIT_FAILURES.labels(GROUP).inc()
            log.warning("offset commit failed (%s); the batch is stored and will be redelivered", exc)

    def _flush_until_done(self, batch: _Batch, stop: threading.Event) -> None:
        """Store ``batch``; on failure pause, keep polling, back off and retry until it is stored."""
        delay = self.config.backoff_initial_s
        while True:
            try:
                self._flush(batch)
            except Exception as exc:
                self._pause()
                log.warning(
                    "storing a batch of %d messages failed (%s: %s); partitions paused, retry in %.1fs",
                    batch.messages,
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                    delay,
                )
                if not isinstance(exc, RetriableError):
                    self._repair_schema()
                deadline = time.monotonic() + delay
                while (left := deadline - time.monotonic()) > 0:
                    if stop.is_set():
                        return  # uncommitted: redelivered after the restart
                    self._consume(min(left, 0.2))  # paused: serves rebalances, keeps membership
                    if self._batch is not batch:
                        return  # revoked: the messages go to the new owner
                delay = min(delay * 2, self.config.backoff_max_s)
                continue
            self._batch = _Batch()
            SINK_PENDING_MESSAGES.labels(GROUP).set(0)
            self._resume()
            return

    def _pause(self) -> None:
        if not self._paused:
            assignment = self._consumer.assignment()
            if assignment:
                self._consumer.pause(assignment)
            self._paused = True
            self.stats.paused = True
            SINK_PAUSED.labels(GROUP).set(1)

    def _resume(self) -> None:
        if self._paused:
            assignment = self._consumer.assignment()
            if assignment:
                self._consumer.resume(assignment)
            self._paused = False
            self.stats.paused = False
            SINK_PAUSED.labels(GROUP).set(0)
            log.info("ClickHouse writes succeed again; partitions resumed")

    # --- rebalance --------------------------------------------------------------------------

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        log.info("sink assigned %d partitions", len(partitions))
        self._assignment = tuple((tp.topic, tp.partition) for tp in partitions)
        self._paused = False
        self.stats.paused = False
        SINK_PAUSED.labels(GROUP).set(0)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._assignment = ()
        dropped = self._batch.messages
        if dropped:
            log.info("rebalance: dropping %d uncommitted messages (they will be redelivered)", dropped)
            SINK_DROPPED_ON_REVOKE.labels(GROUP).inc(dropped)
            self.stats.dropped_on_revoke += dropped
        self._batch = _Batch()
        self._paused = False  # the partitions go; the next assignment starts unpaused
        self.stats.paused = False
        SINK_PAUSED.labels(GROUP).set(0)
        SINK_PENDING_MESSAGES.labels(GROUP).set(0)


#: Playback messages decoded and checked together (see ``SinkLoop._add_playback``).
_DECODE_CHUNK: Final = 512


@dataclass(frozen=True, slots=True)
class _Getters:
    """Per-message accessors applied with ``map`` over a whole consume() result."""

    topic: Callable[[Any], Any]
    error: Callable[[Any], Any]
    partition: Callable[[Any], Any]
    offset: Callable[[Any], Any]
    value: Callable[[Any], Any]


#: confluent-kafka's own method descriptors (~3x cheaper than ``methodcaller`` under ``map``).
_MESSAGE_GETTERS: Final = _Getters(
    Message.topic, Message.error, Message.partition, Message.offset, Message.value
)
#: Any other message-like object (test doubles).
_DUCK_GETTERS: Final = _Getters(
    *(methodcaller(name) for name in ("topic", "error", "partition", "offset", "value"))
)


def _getters(messages: list[Message]) -> _Getters:
    return _MESSAGE_GETTERS if type(messages[0]) is Message else _DUCK_GETTERS


def _event_id_of(value: bytes) -> str | None:
    try:
        document = orjson.loads(value)
    except (orjson.JSONDecodeError, TypeError):
        return None
    event_id = document.get("event_id") if isinstance(document, dict) else None
    return event_id[:128] if isinstance(event_id, str) and event_id else None


class _DlqProducer:
    """Blocking dead-letter sends over :class:`EventProducer` (core profile), from the sink thread.

    The producer is created on the first dead letter (most batches have none).
    """

    def __init__(self, settings: Settings, timeout_s: float) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.producer: EventProducer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, letters: Sequence[DeadLetter]) -> None:
        if self.producer is None:
            self.producer = EventProducer(self.settings, "core", client_id="avcc-sink")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        messages = [(d.topic, d.value, d.key, d.headers) for d in letters]
        try:
            self._loop.run_until_complete(asyncio.wait_for(self.producer.send_many(messages), self.timeout_s))
        except TimeoutError as exc:
            raise DependencyUnavailable(f"DLQ sends not acknowledged within {self.timeout_s}s") from exc

    def close(self) -> None:
        producer, self.producer = self.producer, None
        if producer is not None:
            producer.close(10.0)
        if self._loop is not None and not self._loop.is_running():
            self._loop.close()
            self._loop = None


class SinkRunner:
    """Owns a sink's ClickHouse backends, DLQ producer, :class:`SinkLoop` and its thread."""

    def __init__(
        self,
        settings: Settings,
        *,
        config: SinkConfig | None = None,
        topics: SinkTopics | None = None,
        group_id: str | None = None,
        clickhouse_url: str | None = None,
    ) -> None:
        self.settings = settings
        self.config = config if config is not None else SinkConfig()
        self.topics = topics if topics is not None else SinkTopics.from_config(self.config)
        self.group_id = group_id or self.config.group_id or consumer_group_id(GROUP)
        self.clickhouse_url = clickhouse_url or settings.clickhouse_url
        self.backend = connect(self.clickhouse_url, settings.data_dir)
        # Web queries get their own server connection (they never wait behind a 50k-row
        # insert); chDB is in-process and thread-safe: share it.
        self.query_backend: ClickHouseBackend = (
            self.backend
            if isinstance(self.backend, ChdbBackend)
            else connect(self.clickhouse_url, settings.data_dir)
        )
        self._dlq = _DlqProducer(settings, self.config.dlq_timeout_s)
        self.loop = SinkLoop(
            settings, self.backend, self._dlq, config=self.config, topics=self.topics, group_id=self.group_id
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.on_crash: Callable[[BaseException], None] | None = None

    def start(self) -> None:
        """Start the loop thread (and raise the process's gen-0 GC threshold, see the config)."""
        threshold = self.config.gc_gen0_threshold
        if threshold and gc.get_threshold()[0] < threshold:
            gc.set_threshold(threshold, *gc.get_threshold()[1:])
        self._thread = threading.Thread(target=self._run, name="clickhouse-sink", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.loop.run(self._stop)
        except BaseException as exc:
            self.error = exc
            log.critical("sink loop crashed: %s\n%s", exc, traceback.format_exc())
            if self.on_crash is not None:
                self.on_crash(exc)

    @property
    def running(self) -> bool:
        """Whether the loop thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the loop (stores the current batch if it can), flush the DLQ producer, close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("sink thread did not stop within %.0fs", timeout_s)
        self._dlq.close()
        if self.query_backend is not self.backend:
            self.query_backend.close()
        self.backend.close()


# --- the faust app of the sink group -----------------------------------------------------------

app: faust.App = get_app(GROUP)
# The sink consumes with its own confluent-kafka consumer; faust's consumer and producer would
# only join the group pointlessly (and an App without topics cannot subscribe at all).
app.boot_strategy = app.BootStrategy(app, enable_kafka=False)

_active: SinkRunner | None = None


def _assigned() -> list[tuple[str, int]]:
    if _active is None:
        raise RuntimeError("the sink is not running")
    return _active.loop.assignment()


def _ready() -> tuple[bool, str]:
    runner = _active
    if runner is None or not runner.running:
        return False, "the sink loop is not running"
    if runner.loop.stats.paused:
        return False, "ClickHouse writes are failing: partitions paused, retrying"
    return True, ""


install_common_views(app, GROUP, assignment=_assigned, ready_check=_ready)


@app.service
class SinkService(mode.Service):
    """Runs a :class:`SinkRunner` for the life of the worker; its crash stops the worker."""

    def __init__(self, *, runner_factory: Callable[[], SinkRunner] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._factory = runner_factory or (lambda: SinkRunner(get_settings()))
        self.runner: SinkRunner | None = None

    async def on_start(self) -> None:
        global _active
        loop = asyncio.get_running_loop()
        self.runner = await loop.run_in_executor(None, self._factory)

        def crashed(exc: BaseException) -> None:
            loop.call_soon_threadsafe(lambda: loop.create_task(self.crash(exc)))

        self.runner.on_crash = crashed
        self.runner.start()
        _active = self.runner

    async def on_stop(self) -> None:
        global _active
        runner, self.runner = self.runner, None
        if runner is not None:
            if _active is runner:
                _active = None
            await asyncio.get_running_loop().run_in_executor(None, runner.stop, 30.0)


def _int_param(query: Any, name: str, default: int, low: int, high: int) -> int:
    text = query.get(name)
    if text in (None, ""):
        return default
    if not (text.isascii() and text.lstrip("-").isdigit()) or len(text) > 19:
        raise ValueError(f"{name} must be an integer")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}")
    return value


def _text_param(query: Any, name: str) -> str | None:
    text = query.get(name)
    if text in (None, ""):
        return None
    if len(text) > 200:
        raise ValueError(f"{name} is too long")
    return str(text)


async def _answer(route: str, request: web.Request, work: Callable[[ClickHouseBackend], Any]) -> web.Response:
    runner = _active
    if runner is None:
        return json_error(503, "the sink is not running", reason="unavailable", retry_after_s=1)
    try:
        body = await asyncio.get_running_loop().run_in_executor(None, work, runner.query_backend)
        return json_response(body)
    except DependencyUnavailable as exc:
        return json_error(503, str(exc), reason="clickhouse_unavailable", retry_after_s=5)


@app.page(STATS_ROUTE)
class PlaybackStatsView(faust.web.View):
    """``GET /v1/playback/stats``: exact play/complete/purchase counts, revenue, unique users."""

    @require_hmac
    async def get(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            avcc_code = _text_param(query, "avcc_code")
            from_ms = _int_param(query, "from_ms", 0, 0, MAX_EPOCH_MS)
            to_ms = _int_param(query, "to_ms", MAX_EPOCH_MS, 0, MAX_EPOCH_MS)
        except ValueError as exc:
            return json_error(400, str(exc), reason="bad_parameter")
        return await _answer(
            STATS_ROUTE, request, lambda backend: playback_stats(backend, avcc_code, from_ms, to_ms)
        )


@app.page(ANOMALIES_ROUTE)
class PlaybackAnomaliesView(faust.web.View):
    """``GET /v1/playback/anomalies``: distinct anomalies, newest window first."""

    @require_hmac
    async def get(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            avcc_code = _text_param(query, "avcc_code")
            rule = _text_param(query, "rule")
            from_ms = _int_param(query, "from_ms", 0, 0, MAX_EPOCH_MS)
            to_ms = _int_param(query, "to_ms", MAX_EPOCH_MS, 0, MAX_EPOCH_MS)
            limit = _int_param(query, "limit", 100, 1, 10_000)
        except ValueError as exc:
            return json_error(400, str(exc), reason="bad_parameter")
        return await _answer(
            ANOMALIES_ROUTE,
            request,
            lambda backend: {"anomalies": list_anomalies(backend, avcc_code, rule, from_ms, to_ms, limit)},
        )
