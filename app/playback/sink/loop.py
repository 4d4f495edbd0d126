"""The sink's blocking consume -> insert -> commit loop (one confluent-kafka consumer, one thread).

faust costs ~180 us per event, so the sink does not iterate through faust: this loop runs in a
dedicated thread (the event loop stays free for the web views)::

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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import Consumer, KafkaException, TopicPartition

from app.platform.errors import RetriableError
from app.platform.faust.app import consumer_group_id
from app.platform.kafka.clients import consumer_config
from app.platform.kafka.consumer_loop import ConsumerLoop
from app.platform.metrics import (
    CH_BATCH_ROWS,
    CH_INSERT_FAILURES,
    CH_INSERT_SECONDS,
    DEDUP_HITS,
    DLQ_MESSAGES,
    EVENT_AGE,
    EVENTS_IN,
    SINK_COMMIT_FAILURES,
    SINK_DROPPED_ON_REVOKE,
    SINK_PAUSED,
    SINK_PENDING_MESSAGES,
    SINK_ROWS_WRITTEN,
)
from app.platform.settings import Settings
from app.playback.sink.batch import GROUP, BatchAssembly, SinkBatch, SinkStats, SinkTopics
from app.playback.sink.clickhouse import ClickHouseBackend
from app.playback.sink.columns import PlaybackColumns
from app.playback.sink.dlq import DeadLetterSender
from app.playback.sink.settings import SinkSettings, get_sink_settings
from app.playback.sink.store import ANOMALY_TABLE, PLAYBACK_TABLE, ensure_schema

__all__ = ["CLIENT_ID", "SinkLoop", "sink_consumer_config"]

log = logging.getLogger(__name__)

#: ``client.id`` of the sink's consumer.
CLIENT_ID: Final = "avcc-sink"


def sink_consumer_config(settings: Settings, group_id: str) -> dict[str, Any]:
    """librdkafka configuration of the sink consumer (security settings from ``settings``)."""
    return consumer_config(
        settings,
        group_id,
        CLIENT_ID,
        auto_offset_reset="earliest",
        # Eager protocol: a rebalance revokes every partition, so dropping the whole
        # uncommitted batch on revoke never skips a partition we keep.
        assignment_strategy="roundrobin",
        **{
            "enable.partition.eof": False,
            # Prefetch bound (per consumer): with the batch it bounds the sink's memory.
            "queued.max.messages.kbytes": 32 * 1024,
        },
    )


class SinkLoop(ConsumerLoop):
    """The blocking consume -> insert -> commit loop (run it in its own thread with :meth:`run`)."""

    def __init__(
        self,
        settings: Settings,
        backend: ClickHouseBackend,
        dead_letter: DeadLetterSender,
        *,
        config: SinkSettings | None = None,
        topics: SinkTopics | None = None,
        group_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.sink_config = config if config is not None else get_sink_settings()
        self.sink_topics = topics if topics is not None else SinkTopics()
        self.group_id = group_id or consumer_group_id(GROUP)
        super().__init__(
            sink_consumer_config(settings, self.group_id),
            [self.sink_topics.playback, self.sink_topics.anomaly],
        )
        self._dead_letter = dead_letter
        self.stats = SinkStats()
        self._assembly = BatchAssembly(self.sink_topics, self.group_id, self.stats)
        self._batch = SinkBatch()
        self._paused = False
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
            self.open()
            log.info(
                "sink consuming %s, %s as %s into %s",
                self.sink_topics.playback,
                self.sink_topics.anomaly,
                self.group_id,
                self.backend.description,
            )
            self._loop(stop)
        finally:
            self.stats.cpu_seconds += time.thread_time() - cpu0
            self._close()

    def _ensure_schema(self, stop: threading.Event) -> bool:
        delay = self.sink_config.backoff_initial_s
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
                delay = min(delay * 2, self.sink_config.backoff_max_s)
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
        try:
            self.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("sink consumer close failed: %s", exc)
        self._assignment = ()
        SINK_PAUSED.labels(GROUP).set(0)
        SINK_PENDING_MESSAGES.labels(GROUP).set(0)

    def _open_consumer(self) -> Consumer:
        consumer = self.consumer
        if consumer is None:
            raise RuntimeError("the sink consumer is not open")
        return consumer

    def _loop(self, stop: threading.Event) -> None:
        config = self.sink_config
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

    def _consume(self, timeout: float) -> None:
        batch = self._batch
        want = max(1, min(self.sink_config.consume_chunk, self.sink_config.batch_max_rows - batch.messages))
        messages = self._open_consumer().consume(num_messages=want, timeout=timeout)
        batch = self._batch  # a rebalance inside consume() may have replaced it
        if messages:
            self._assembly.add(batch, messages)

    # --- storing ----------------------------------------------------------------------------

    def _flush(self, batch: SinkBatch) -> None:
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
            DEDUP_HITS.labels(GROUP, self.sink_topics.playback).inc(batch.playback.duplicates)
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
        histogram = EVENT_AGE.labels(GROUP, self.sink_topics.playback)
        for ts_ms in block.timestamps_ms()[:: self.sink_config.age_sample_every]:
            histogram.observe(max(0.0, (now_ms - ts_ms) / 1000))

    def _commit(self, batch: SinkBatch) -> None:
        offsets = batch.commit_offsets()
        if not offsets:
            return
        try:
            self._open_consumer().commit(offsets=offsets, asynchronous=False)
            self.stats.commits += 1
        except KafkaException as exc:
            # The rows are stored: a lost commit only means redelivery, which deduplicates.
            SINK_COMMIT_FAILURES.labels(GROUP).inc()
            log.warning("offset commit failed (%s); the batch is stored and will be redelivered", exc)

    def _flush_until_done(self, batch: SinkBatch, stop: threading.Event) -> None:
        """Store ``batch``; on failure pause, keep polling, back off and retry until it is stored."""
        delay = self.sink_config.backoff_initial_s
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
                delay = min(delay * 2, self.sink_config.backoff_max_s)
                continue
            self._batch = SinkBatch()
            SINK_PENDING_MESSAGES.labels(GROUP).set(0)
            self._resume()
            return

    def _pause(self) -> None:
        self._set_paused(True)

    def _resume(self) -> None:
        if self._set_paused(False):
            log.info("ClickHouse writes succeed again; partitions resumed")

    def _set_paused(self, paused: bool) -> bool:
        """Pause (or resume) every assigned partition; ``False`` if they already were."""
        if self._paused == paused:
            return False
        consumer = self._open_consumer()
        assignment = consumer.assignment()
        if assignment:
            if paused:
                consumer.pause(assignment)
            else:
                consumer.resume(assignment)
        self._paused = paused
        self.stats.paused = paused
        SINK_PAUSED.labels(GROUP).set(1 if paused else 0)
        return True

    # --- rebalance --------------------------------------------------------------------------

    def on_assigned(self, partitions: list[TopicPartition]) -> None:
        """New assignment: publish it, start unpaused."""
        log.info("sink assigned %d partitions", len(partitions))
        self._assignment = tuple(sorted(self.assigned))
        self._paused = False
        self.stats.paused = False
        SINK_PAUSED.labels(GROUP).set(0)

    def on_revoked(self, partitions: list[TopicPartition], lost: bool) -> None:
        """Revoked or lost: drop the uncommitted batch (its messages go to the new owner)."""
        self._assignment = ()
        dropped = self._batch.messages
        if dropped:
            log.info("rebalance: dropping %d uncommitted messages (they will be redelivered)", dropped)
            SINK_DROPPED_ON_REVOKE.labels(GROUP).inc(dropped)
            self.stats.dropped_on_revoke += dropped
        self._batch = SinkBatch()
        self._paused = False  # the partitions go; the next assignment starts unpaused
        self.stats.paused = False
        SINK_PAUSED.labels(GROUP).set(0)
        SINK_PENDING_MESSAGES.labels(GROUP).set(0)
