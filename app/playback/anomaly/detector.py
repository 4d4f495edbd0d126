"""The anomaly detector's I/O loop: two stages in one consumer of group ``avcc-anomaly``.

faust's per-event machinery costs ~180 us/event, so the detector runs in a thread with its own
confluent-kafka consumer (manual commits) taking up to ``batch_size`` messages per call from:

Stage 1 -- ``topic.playback.event`` (per source partition)
    Envelopes are decoded with orjson and counted into their partition's windows
    (:class:`~app.playback.anomaly.windows.Windows`, a few dict updates); windows the watermark
    has passed go, split by code bucket, to the partials topic with each partition's progress
    marker (:mod:`~app.playback.anomaly.partials`).
Stage 2 -- the partials topic (per code bucket)
    Every source partition's partials of a code meet in one partition
    (:mod:`~app.playback.anomaly.merge`); a window is evaluated once all source partitions have
    closed it, so the findings do not depend on how many workers share the partitions.

Output: ``AnomalyDetected`` envelopes on ``topic.playback.anomaly`` (core producer, acks=all),
keyed by ``avcc_code``; ``event_id`` = ``anomaly_id`` = uuid5(rule, key, window start), so a
replay produces the same ids (the sink stores them once).

Durability: offsets of both topics are committed every ``commit_interval_s`` (and on
revocation/stop) only after the partials and anomalies produced so far are acknowledged and a
snapshot of every changed state is in the local store and acknowledged on its compacted changelog
(declared in :mod:`tables.anomaly`, backed by :mod:`app.playback.anomaly.state`); on assignment each
partition's snapshot is restored and the consumer seeks to its offset. A partial replayed after a
crash is merged once (source marks).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import orjson
from confluent_kafka import (
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
from app.platform.gc_tuning import raise_gen0_threshold
from app.platform.groups import group_spec
from app.platform.kafka.admin import ensure_state_topic
from app.platform.kafka.clients import consumer_config, producer_config
from app.platform.kafka.consumer_loop import ConsumerLoop, in_thread
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
from app.platform.topics import (
    ANOMALY,
    ANOMALY_MERGE_CHANGELOG,
    ANOMALY_WINDOW_CHANGELOG,
    ANOMALY_WINDOW_PARTIALS,
    PLAYBACK_EVENT,
)
from app.playback.anomaly.merge import ClosedWindow, Merger, MergeState
from app.playback.anomaly.partials import Partial, decode_partial, encode_partials
from app.playback.anomaly.rules import to_anomaly
from app.playback.anomaly.settings import (
    AnomalyRuleSettings,
    AnomalySettings,
    get_anomaly_rule_settings,
    get_anomaly_settings,
)
from app.playback.anomaly.state import (
    CHANGELOG_TOPIC,
    MERGE_CHANGELOG_TOPIC,
    SNAPSHOT_MAX_BYTES,
    StateTopic,
    WindowStore,
    restore_states,
    window_store_dir,
)
from app.playback.anomaly.windows import PartitionClose, PartitionState, Windows
from schemas.codec import dumps
from schemas.envelope import make_envelope

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
    """The blocking consume -> window -> merge -> evaluate -> checkpoint loop (run it in a thread).

    Topic and group names are parameters so tests and the bench can use their own topics;
    ``partitions``/``buckets``: partition counts of the source/partials topic. ``on_anomaly``
    (optional) is called with each produced anomaly payload (tests, bench).
    """

    def __init__(
        self,
        settings: Settings,
        config: AnomalySettings | None = None,
        *,
        rules: AnomalyRuleSettings | None = None,
        source_topic: str = PLAYBACK_EVENT.name,
        anomaly_topic: str = ANOMALY.name,
        changelog_topic: str = CHANGELOG_TOPIC,
        partials_topic: str = ANOMALY_WINDOW_PARTIALS.name,
        merge_changelog_topic: str = MERGE_CHANGELOG_TOPIC,
        partitions: int = PLAYBACK_EVENT.partitions,
        buckets: int = ANOMALY_WINDOW_PARTIALS.partitions,
        group_id: str | None = None,
        state_dir: Path | None = None,
        on_anomaly: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.anomaly_settings = config if config is not None else get_anomaly_settings()
        self.rules = rules if rules is not None else get_anomaly_rule_settings()
        self.source_topic = source_topic
        self.anomaly_topic = anomaly_topic
        self.changelog_topic = changelog_topic
        self.partials_topic = partials_topic
        self.merge_changelog_topic = merge_changelog_topic
        self.partitions = partitions
        self.buckets = buckets
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
            [source_topic, partials_topic],
        )
        self.state_dir = window_store_dir(settings, state_dir or self.anomaly_settings.state_dir)
        self.on_anomaly = on_anomaly
        self.windows = Windows(
            self.rules,
            lateness_windows=self.anomaly_settings.lateness_windows,
            max_future_ms=self.anomaly_settings.max_future_s * 1000,
        )
        self.merger = Merger(self.rules, sources=partitions)
        self._window_states = StateTopic(
            source_topic, changelog_topic, "p", PartitionState.from_bytes, PartitionState
        )
        self._merge_states = StateTopic(
            partials_topic, merge_changelog_topic, "m", MergeState.from_bytes, MergeState
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
        """The stage-1 window state of each owned source partition."""
        return self.windows.states

    def assignment(self) -> list[tuple[str, int]]:
        """``(topic, partition)`` of every partition whose state this detector holds."""
        owned = [(self.source_topic, p) for p in list(self.states)]
        return owned + [(self.partials_topic, p) for p in list(self.merger.states)]

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to checkpoint and return (thread-safe)."""
        self._stop.set()

    async def serve(self) -> None:
        """:meth:`run` on a thread of its own, for the worker's own-consumer service."""
        await in_thread(self.run, "anomaly-detector")

    def readiness(self) -> tuple[bool, str]:
        """Ready once assigned: a restored partition is consumed from its snapshot's offset."""
        return True, ""

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
        raise_gen0_threshold(self.anomaly_settings.gc_gen0_threshold)
        settings = self.settings
        for spec, name, partitions in (
            (ANOMALY_WINDOW_CHANGELOG, self.changelog_topic, self.partitions),
            (ANOMALY_WINDOW_PARTIALS, self.partials_topic, self.buckets),
            (ANOMALY_MERGE_CHANGELOG, self.merge_changelog_topic, self.buckets),
        ):
            ensure_state_topic(settings, replace(spec, name=name, partitions=partitions))
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
                    self.checkpoint(list(self.states), list(self.merger.states))
            self.checkpoint(list(self.states), list(self.merger.states))
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
        """Count a batch of source messages into their windows; merge partials records."""
        windows = self.windows
        source = self.source_topic
        now_ms = time.time_ns() // 1_000_000
        run: list[Message] = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == _EOF:
                    if message.topic() == source:
                        if run:
                            self._count(run, now_ms)
                            run = []
                        windows.reached_end(message.partition())
                    continue
                if error.fatal():
                    raise KafkaException(error)
                log.warning("consumer error: %s", error.str())
                continue
            if message.topic() != source:
                self._merge(message)
                continue
            run.append(message)
        if run:
            self._count(run, now_ms)

    def _merge(self, message: Message) -> None:
        partial: Partial | None
        try:
            partial = decode_partial(message.value())
        except ValueError as exc:
            log.warning("partials record %d@%d skipped: %s", message.partition(), message.offset(), exc)
            ANOMALY_SKIPPED_EVENTS.labels("undecodable_partial").inc()
            partial = None
        self.merger.add(message.partition(), message.offset(), partial)

    def _count(self, run: list[Message], now_ms: int) -> None:
        # Decoded one at a time as they are counted: a whole batch of decoded envelopes alive
        # at once made every young GC collection walk them (a third of the detector's CPU).
        tally = self.windows.count(((m.partition(), m.offset(), _decode(m.value())) for m in run), now_ms)
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
        """Stage 1: close passed windows and send their partials; stage 2: evaluate complete
        windows and emit their findings. Returns how many windows stage 2 evaluated."""
        watermark = self.windows.watermark()
        if watermark >= 0:
            for close in self.windows.close(watermark):
                self._send_partials(close)
            ANOMALY_WATERMARK.set(watermark)
        closed = self.merger.close()
        for window in closed:
            self._emit(window)
        ANOMALY_OPEN_WINDOWS.set(self.windows.open_windows() + self.merger.open_windows())
        return len(closed)

    def _send_partials(self, close: PartitionClose) -> None:
        producer = self._producer
        assert producer is not None
        key = str(close.partition).encode()
        for bucket, record in enumerate(encode_partials(close, self.buckets)):
            producer.produce(
                self.partials_topic, record, key, partition=bucket, on_delivery=self._on_delivery
            )
        producer.poll(0)

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

    def checkpoint(self, sources: Iterable[int], buckets: Iterable[int] = ()) -> int:
        """Snapshot the changed states of source partitions ``sources`` and partials partitions
        ``buckets`` (local + changelog, acked), then commit their offsets; returns how many."""
        self._last_checkpoint = time.monotonic()
        owned = (self.states.get(p) for p in sources)
        changed = [s for s in owned if s is not None and s.dirty and s.offset is not None]
        owned_merges = (self.merger.states.get(p) for p in buckets)
        merged = [s for s in owned_merges if s is not None and s.dirty and s.offset is not None]
        if not changed and not merged:
            return 0
        started = time.perf_counter()
        # 1. partials and anomalies first: a snapshot must never be ahead of undelivered output
        self._flush("partials and anomaly events")
        max_pairs = self.anomaly_settings.snapshot_max_pairs
        for state in changed:
            self._snapshot(self._window_states, state.partition, state.to_bytes(max_pairs))
        for merge in merged:
            self._snapshot(self._merge_states, merge.partition, merge.to_bytes(max_pairs))
        # 2. snapshots acknowledged (acks=all) before the commit
        self._flush("window snapshots")
        consumer = self._consumer
        assert consumer is not None
        offsets = [TopicPartition(self.source_topic, s.partition, s.offset) for s in changed]
        offsets += [TopicPartition(self.partials_topic, m.partition, m.offset) for m in merged]
        consumer.commit(offsets=offsets, asynchronous=False)
        done: list[PartitionState | MergeState] = [*changed, *merged]
        for snapshotted in done:
            snapshotted.dirty = False
        ANOMALY_CHECKPOINT_SECONDS.observe(time.perf_counter() - started)
        return len(changed) + len(merged)

    def _snapshot(self, states: StateTopic[Any], partition: int, snapshot: bytes) -> None:
        store, producer = self._store, self._producer
        assert store is not None and producer is not None
        store.put(partition, snapshot, states.kind)
        key = str(partition).encode()
        producer.produce(states.changelog, snapshot, key, partition=partition, on_delivery=self._on_delivery)

    # -- rebalance -----------------------------------------------------------------------------

    def _split(self, partitions: list[TopicPartition]) -> tuple[list[int], list[int]]:
        """Source partition numbers and partials partition numbers of ``partitions``."""
        sources = [tp.partition for tp in partitions if tp.topic == self.source_topic]
        return sources, [tp.partition for tp in partitions if tp.topic != self.source_topic]

    def on_assigned(self, partitions: list[TopicPartition]) -> None:
        """Restore each partition's snapshot (either stage) and seek to the offset stored in it."""
        consumer, store = self._consumer, self._store
        assert consumer is not None and store is not None
        sources, buckets = self._split(partitions)
        states = restore_states(self.settings, store, consumer, self._window_states, sources)
        merges = restore_states(self.settings, store, consumer, self._merge_states, buckets)
        assignment = []
        for tp in partitions:
            state = states[tp.partition] if tp.topic == self.source_topic else merges[tp.partition]
            offset = state.offset if state.offset is not None else tp.offset
            assignment.append(TopicPartition(tp.topic, tp.partition, offset))
        self.windows.adopt(states)
        self.merger.adopt(merges)
        consumer.assign(assignment)
        log.info("anomaly: assigned source partitions %s, partials partitions %s", sources, buckets)

    def on_revoked(self, partitions: list[TopicPartition], lost: bool) -> None:
        """Revoked: checkpoint then forget; lost: just forget (the next owner restores)."""
        sources, buckets = self._split(partitions)
        if lost:
            self.windows.forget(sources)
            self.merger.forget(buckets)
            log.warning("anomaly: lost partitions %s / %s (restored by their next owner)", sources, buckets)
            return
        try:
            self.checkpoint(sources, buckets)
        finally:
            self.windows.forget(sources)
            self.merger.forget(buckets)
        log.info("anomaly: revoked source partitions %s, partials partitions %s", sources, buckets)
