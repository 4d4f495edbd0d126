"""The anomaly detector's I/O loop: consume playback events, window them, emit findings, checkpoint.

faust's per-event machinery costs ~180 us/event, so the detector does not iterate through
faust: it runs in a thread with its own confluent-kafka consumer (group ``avcc-anomaly``,
manual commits) that takes up to ``batch_size`` messages per call, decodes each envelope with
orjson and counts it into :class:`~app.playback.anomaly.windows.Windows` (a few dict updates).

Output
    ``AnomalyDetected`` envelopes on ``topic.playback.anomaly`` (core producer, acks=all),
    keyed by ``avcc_code``; ``event_id`` = ``anomaly_id`` = uuid5(rule, key, window start), so
    a replay produces the same ids. The sink stores them; this group only produces.

Durability
    Offsets are committed every ``commit_interval_s`` (and on revocation/stop) only after the
    anomalies produced so far are acknowledged and a snapshot of every changed partition was
    written to the local store and acknowledged on the compacted changelog
    (:mod:`tables.anomaly`); on assignment each partition's snapshot is restored and the
    consumer seeks to the offset stored in it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import orjson
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from pydantic import ValidationError

from app.platform.errors import DependencyUnavailable
from app.platform.faust.app import consumer_group_id
from app.platform.groups import group_spec
from app.platform.kafka.clients import consumer_config, producer_config
from app.platform.kafka.consumer_loop import ConsumerLoop
from app.platform.metrics import (
    ANOMALIES,
    ANOMALY_CHECKPOINT_SECONDS,
    ANOMALY_LATE_EVENTS,
    ANOMALY_OPEN_WINDOWS,
    ANOMALY_SKIPPED_EVENTS,
    ANOMALY_WATERMARK,
    EVENTS_IN,
    EVENTS_OUT,
)
from app.platform.settings import Settings
from app.platform.topics import ANOMALY, PLAYBACK_EVENT
from app.playback.anomaly.config import AnomalySettings
from app.playback.anomaly.rules import to_anomaly
from app.playback.anomaly.windows import ClosedWindow, PartitionState, Windows
from schemas.codec import dumps
from schemas.envelope import make_envelope
from tables.anomaly import (
    CHANGELOG_TOPIC,
    SNAPSHOT_MAX_BYTES,
    WindowStore,
    ensure_changelog,
    read_changelog,
    window_store_dir,
)

__all__ = ["GROUP", "AnomalyDetector"]

log = logging.getLogger(__name__)

#: The anomaly detector's agent group (metric label, consumer group ``avcc-anomaly``).
GROUP: Final = "anomaly"
SOURCE: Final = group_spec(GROUP).source
_EOF: Final = KafkaError._PARTITION_EOF


def _decode(value: bytes | None) -> Any:
    """The envelope document of a message value (``None``: not JSON, counted as undecodable)."""
    try:
        return orjson.loads(value)  # type: ignore[arg-type]
    except (orjson.JSONDecodeError, TypeError):
        return None


class AnomalyDetector(ConsumerLoop):
    """The blocking consume -> window -> evaluate -> checkpoint loop (run it in a thread).

    Topic and group names are parameters so tests and the bench can run it on their own topics.
    ``on_anomaly`` (optional) is called with each produced anomaly payload (tests, bench).
    """

    def __init__(
        self,
        settings: Settings,
        config: AnomalySettings | None = None,
        *,
        source_topic: str = PLAYBACK_EVENT.name,
        anomaly_topic: str = ANOMALY.name,
        changelog_topic: str = CHANGELOG_TOPIC,
        partitions: int = PLAYBACK_EVENT.partitions,
        group_id: str | None = None,
        state_dir: Path | None = None,
        on_anomaly: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.anomaly_settings = config if config is not None else AnomalySettings()
        self.rules = self.anomaly_settings.rule_config()
        self.source_topic = source_topic
        self.anomaly_topic = anomaly_topic
        self.changelog_topic = changelog_topic
        self.partitions = partitions
        self.group_id = group_id or consumer_group_id(GROUP)
        super().__init__(
            consumer_config(
                settings,
                self.group_id,
                f"{self.group_id}-detector",
                auto_offset_reset="earliest",
                assignment_strategy="range",
                **{
                    "enable.partition.eof": True,
                    "max.poll.interval.ms": 300_000,
                    "fetch.min.bytes": 1,
                    "queued.max.messages.kbytes": 65_536,
                },
            ),
            [source_topic],
        )
        self.state_dir = window_store_dir(settings, state_dir or self.anomaly_settings.state_dir)
        self.on_anomaly = on_anomaly
        self.windows = Windows(
            self.rules,
            lateness_windows=self.anomaly_settings.lateness_windows,
            max_future_ms=self.anomaly_settings.max_future_s * 1000,
        )
        self.processed = 0
        self.anomalies = 0
        self._stop = threading.Event()
        self._started = threading.Event()
        #: The open consumer, kept through ``close()`` (its revoke callback still commits).
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._store: WindowStore | None = None
        self._delivery_errors: list[str] = []
        self._last_checkpoint = time.monotonic()
        self._events_in = EVENTS_IN.labels(GROUP, source_topic)

    @property
    def states(self) -> dict[int, PartitionState]:
        """The window state of each owned partition."""
        return self.windows.states

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to checkpoint and return (thread-safe)."""
        self._stop.set()

    def _producer_config(self) -> dict[str, Any]:
        return producer_config(
            self.settings,
            "core",
            f"{self.group_id}-producer",
            **{
                "statistics.interval.ms": 0,
                "message.max.bytes": SNAPSHOT_MAX_BYTES + 65_536,
                "compression.type": "lz4",
            },
        )

    def run(self) -> None:
        """Consume until :meth:`stop`; checkpoint and leave the group on the way out."""
        ensure_changelog(self.settings, self.partitions, topic=self.changelog_topic)
        self._store = WindowStore(Path(self.state_dir))
        self._producer = Producer(self._producer_config())
        consumer = self._consumer = self.open()
        self._started.set()
        interval = self.anomaly_settings.commit_interval_s
        batch_size = self.anomaly_settings.batch_size
        try:
            while not self._stop.is_set():
                messages = consumer.consume(num_messages=batch_size, timeout=0.2)
                if messages:
                    self.process(messages)
                self.close_windows()
                if time.monotonic() - self._last_checkpoint >= interval:
                    self.checkpoint(list(self.states))
            self.checkpoint(list(self.states))
        finally:
            try:
                self.close()
            finally:
                self._producer.flush(30)
                self._producer = self._consumer = None
                self._store.close()
                self._store = None

    # -- hot path ----------------------------------------------------------------------------

    def process(self, messages: Sequence[Message]) -> None:
        """Count a batch of messages into the windows of their partitions."""
        windows = self.windows
        now_ms = time.time_ns() // 1_000_000
        run: list[tuple[int, int, Any]] = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == _EOF:
                    if run:
                        self._count(run, now_ms)
                        run = []
                    windows.reached_end(message.partition())
                    continue
                if error.fatal():
                    raise KafkaException(error)
                log.warning("consumer error: %s", error.str())
                continue
            run.append((message.partition(), message.offset(), _decode(message.value())))
        if run:
            self._count(run, now_ms)

    def _count(self, run: list[tuple[int, int, Any]], now_ms: int) -> None:
        tally = self.windows.count(run, now_ms)
        self.processed += tally.counted
        if tally.counted:
            self._events_in.inc(tally.counted)
        if tally.late:
            ANOMALY_LATE_EVENTS.inc(tally.late)
        if tally.undecodable:
            ANOMALY_SKIPPED_EVENTS.labels("undecodable").inc(tally.undecodable)
        if tally.future:
            ANOMALY_SKIPPED_EVENTS.labels("future").inc(tally.future)
        if tally.duplicates:
            ANOMALY_SKIPPED_EVENTS.labels("duplicate").inc(tally.duplicates)

    # -- windows -----------------------------------------------------------------------------

    def watermark(self) -> int:
        """The detector's watermark (epoch ms; -1: unknown), see :meth:`Windows.watermark`."""
        return self.windows.watermark()

    def close_windows(self) -> int:
        """Evaluate, emit and forget every window the watermark has passed; returns how many."""
        watermark = self.windows.watermark()
        if watermark < 0:
            return 0
        closed = self.windows.close(watermark)
        for window in closed:
            self._emit(window)
        ANOMALY_WATERMARK.set(watermark)
        ANOMALY_OPEN_WINDOWS.set(self.windows.open_windows())
        return len(closed)

    def _emit(self, window: ClosedWindow) -> None:
        producer = self._producer
        assert producer is not None
        for finding in window.findings:
            try:
                anomaly = to_anomaly(finding, window.start, window.end)
            except ValidationError as exc:
                log.warning("anomaly %s on %r not emitted: %s", finding.rule, finding.key, exc)
                ANOMALY_SKIPPED_EVENTS.labels("invalid_finding").inc()
                continue
            envelope = make_envelope(anomaly, source=SOURCE, event_id=uuid.UUID(anomaly.anomaly_id))
            key = (anomaly.avcc_code or anomaly.rule).encode()
            producer.produce(self.anomaly_topic, dumps(envelope), key, on_delivery=self._on_delivery)
            producer.poll(0)
            ANOMALIES.labels(anomaly.rule).inc()
            EVENTS_OUT.labels(GROUP, self.anomaly_topic).inc()
            self.anomalies += 1
            if self.on_anomaly is not None:
                self.on_anomaly(anomaly.model_dump(mode="json") | {"source_partitions": window.partitions})

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._delivery_errors.append(f"{message.topic()}[{message.partition()}]: {error.str()}")

    # -- durability ----------------------------------------------------------------------------

    def _flush(self, what: str) -> None:
        assert self._producer is not None
        remaining = self._producer.flush(30)
        if remaining or self._delivery_errors:
            errors, self._delivery_errors = self._delivery_errors, []
            raise DependencyUnavailable(f"{what}: {remaining} undelivered, errors {errors[:5]}")

    def checkpoint(self, partitions: Iterable[int]) -> int:
        """Snapshot the changed ``partitions`` (local + changelog, acked) then commit; returns count."""
        self._last_checkpoint = time.monotonic()
        owned = (self.states.get(p) for p in partitions)
        changed = [s for s in owned if s is not None and s.dirty and s.offset is not None]
        if not changed:
            return 0
        started = time.perf_counter()
        # 1. anomalies first: a snapshot must never be ahead of undelivered findings
        self._flush("anomaly events")
        store, producer, consumer = self._store, self._producer, self._consumer
        assert store is not None and producer is not None and consumer is not None
        max_pairs = self.anomaly_settings.snapshot_max_pairs
        for state in changed:
            snapshot = state.to_bytes(max_pairs)
            store.put(state.partition, snapshot)
            producer.produce(
                self.changelog_topic,
                snapshot,
                str(state.partition).encode(),
                partition=state.partition,
                on_delivery=self._on_delivery,
            )
        # 2. snapshots acknowledged (acks=all) before the commit
        self._flush("window snapshots")
        offsets = [TopicPartition(self.source_topic, s.partition, s.offset) for s in changed]
        consumer.commit(offsets=offsets, asynchronous=False)
        for state in changed:
            state.dirty = False
        ANOMALY_CHECKPOINT_SECONDS.observe(time.perf_counter() - started)
        return len(changed)

    def _restore(self, consumer: Consumer, partitions: list[int]) -> dict[int, PartitionState]:
        store = self._store
        assert store is not None
        committed = {
            tp.partition: tp.offset
            for tp in consumer.committed(
                [TopicPartition(self.source_topic, p) for p in partitions], timeout=30
            )
        }
        restored: dict[int, PartitionState] = {}
        need_changelog: list[int] = []
        for partition in partitions:
            raw = store.get(partition)
            state = PartitionState.from_bytes(raw) if raw else None
            floor = committed.get(partition, OFFSET_INVALID)
            if state is not None and state.offset is not None and (floor < 0 or state.offset >= floor):
                restored[partition] = state
            else:
                need_changelog.append(partition)
                if state is not None:
                    restored[partition] = state
        if need_changelog:
            snapshots = read_changelog(self.settings, need_changelog, topic=self.changelog_topic)
            for partition, raw in snapshots.items():
                remote = PartitionState.from_bytes(raw)
                local = restored.get(partition)
                if local is None or (remote.offset or 0) >= (local.offset or 0):
                    restored[partition] = remote
        sources = {p: ("local" if p not in need_changelog else "changelog") for p in restored}
        log.info("anomaly: restored %d of %d partitions (%s)", len(restored), len(partitions), sources)
        for partition in partitions:
            restored.setdefault(partition, PartitionState(partition))
        return restored

    # -- rebalance -----------------------------------------------------------------------------

    def on_assigned(self, partitions: list[TopicPartition]) -> None:
        """Restore each partition's snapshot and seek to the offset stored in it."""
        consumer = self._consumer
        assert consumer is not None
        numbers = [tp.partition for tp in partitions]
        states = self._restore(consumer, numbers)
        assignment = []
        for tp in partitions:
            state = states[tp.partition]
            offset = state.offset if state.offset is not None else tp.offset
            assignment.append(TopicPartition(tp.topic, tp.partition, offset))
        self.windows.adopt(states)
        consumer.assign(assignment)
        log.info("anomaly: assigned partitions %s", numbers)

    def on_revoked(self, partitions: list[TopicPartition], lost: bool) -> None:
        """Revoked: checkpoint then forget; lost: just forget (the next owner restores)."""
        numbers = [tp.partition for tp in partitions]
        if lost:
            self.windows.forget(numbers)
            log.warning("anomaly: lost partitions %s (state is restored by their next owner)", numbers)
            return
        try:
            self.checkpoint(numbers)
        finally:
            self.windows.forget(numbers)
        log.info("anomaly: revoked partitions %s", numbers)
