"""Anomaly group: windowed detection on ``topic.playback.event`` (replaces the Flink job).

Hot path
    faust's per-event machinery costs ~180 us/event, so the detector does not iterate through
    faust: :class:`AnomalyService` (a ``mode.Service`` on the group's faust app) runs
    :class:`AnomalyDetector` in a thread -- a confluent-kafka consumer (group
    ``avcc-anomaly``, manual commits) that takes up to ``batch_size`` messages per call, decodes
    each envelope with orjson and bumps a few dict counters (:meth:`WindowAgg.add`). faust's
    own Kafka consumer is disabled for this app, so only that consumer joins the group.

Event time
    Tumbling windows of ``window_s`` on the envelope ``timestamp``. Each partition's watermark
    is the max event time seen in it; the detector's watermark is the minimum over its
    partitions that still have data to read (a partition at its end of log does not hold time
    back). A window closes -- is evaluated and forgotten -- once the watermark passes its end
    plus ``lateness_windows`` windows. Lateness policy: an event whose window has already
    closed is *late*: counted (``avcc_anomaly_late_events_total``) and dropped, never
    re-opening a window. Events more than ``max_future_s`` ahead of the wall clock are skipped
    (a bogus clock must not close every window). Name-based (uuid5, i.e. partner-idempotent)
    event ids are deduplicated within the open windows.

Rules
    Pure functions in :mod:`app.playback.anomaly.rules`. The windows of all partitions this worker owns
    are merged before evaluation, so with one worker (50k+ events/s per core, see the bench)
    every rule sees the whole stream; with several workers each evaluates its share and the
    findings carry the same deterministic ids (consumers dedup on ``event_id``), but the count
    thresholds then apply to that share (see the README's scaling note).

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

Run: ``faust -A agents.anomaly worker --web-port 6073`` (or ``avcc worker anomaly``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import faust
import mode
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
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.errors import DependencyUnavailable
from app.platform.faust.app import consumer_group_id, get_app
from app.platform.groups import group_spec
from app.platform.http.views import install_common_views
from app.platform.kafka.producers import profile_config
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
from app.platform.settings import Settings, get_settings
from app.platform.topics import ANOMALY, PLAYBACK_EVENT
from app.playback.anomaly.rules import (
    RuleConfig,
    WindowAgg,
    evaluate_window,
    merge_baselines,
    merge_windows,
    to_anomaly,
    update_baseline,
)
from schemas.codec import dumps
from schemas.envelope import make_envelope
from tables.anomaly import (
    CHANGELOG_TOPIC,
    SNAPSHOT_MAX_BYTES,
    PartitionState,
    WindowStore,
    ensure_changelog,
    read_changelog,
)

__all__ = [
    "AnomalyDetector",
    "AnomalyService",
    "AnomalySettings",
    "app",
]

log = logging.getLogger(__name__)

GROUP: Final = "anomaly"
SOURCE: Final = group_spec(GROUP).source
_EOF: Final = KafkaError._PARTITION_EOF


class AnomalySettings(BaseSettings):
    """Windows, rule thresholds and loop knobs. Each field maps to ``AVCC_ANOMALY_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_ANOMALY_", frozen=True, extra="ignore")

    window_s: int = Field(default=60, ge=1, description="Tumbling window length (event time).")
    lateness_windows: int = Field(
        default=2, ge=0, description="A window closes when the watermark passes its end + this many windows."
    )
    max_future_s: int = Field(
        default=600, ge=0, description="Events further ahead of the wall clock are skipped."
    )
    ewma_alpha: float = Field(
        default=0.3, gt=0, le=1, description="Weight of the newest window in baselines."
    )
    min_history_windows: int = Field(
        default=3, ge=1, description="Baseline windows before ratio rules apply."
    )
    spike_factor: float = Field(default=5.0, gt=1, description="traffic_spike: count >= factor x baseline.")
    spike_min_count: int = Field(default=100, ge=1, description="traffic_spike: minimum window count.")
    replay_min_count: int = Field(default=30, ge=2, description="user_replay: plays of one code by one user.")
    share_jump: float = Field(default=0.3, gt=0, le=1, description="node_share_jump: share - baseline share.")
    share_min_count: int = Field(default=200, ge=1, description="node_share_jump: minimum code count.")
    max_duration_sec: dict[str, int] = Field(
        default_factory=lambda: {"play": 86_400, "complete": 86_400, "purchase": 86_400},
        description="impossible_duration: most seconds per event type (JSON).",
    )
    purchase_min_cny: float = Field(default=0.01, ge=0, description="revenue_out_of_bounds: lowest purchase.")
    purchase_max_cny: float = Field(
        default=10_000.0, gt=0, description="revenue_out_of_bounds: highest purchase."
    )
    batch_size: int = Field(default=10_000, ge=1, description="Messages taken per consume call.")
    commit_interval_s: float = Field(default=5.0, gt=0, description="Snapshot + commit period.")
    snapshot_max_pairs: int = Field(
        default=20_000, ge=0, description="(code, user) counters kept per window in a snapshot."
    )
    state_dir: Path | None = Field(
        default=None, description="Local snapshot store (default: <data_dir>/workers/anomaly/windows)."
    )

    def rule_config(self) -> RuleConfig:
        """The thresholds as the rules take them."""
        return RuleConfig(
            window_ms=self.window_s * 1000,
            ewma_alpha=self.ewma_alpha,
            min_history_windows=self.min_history_windows,
            spike_factor=self.spike_factor,
            spike_min_count=self.spike_min_count,
            replay_min_count=self.replay_min_count,
            share_jump=self.share_jump,
            share_min_count=self.share_min_count,
            max_duration_sec=dict(self.max_duration_sec),
            purchase_min_cny=self.purchase_min_cny,
            purchase_max_cny=self.purchase_max_cny,
        )


class AnomalyDetector:
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
        self.config = config if config is not None else AnomalySettings()
        self.rules = self.config.rule_config()
        self.source_topic = source_topic
        self.anomaly_topic = anomaly_topic
        self.changelog_topic = changelog_topic
        self.partitions = partitions
        self.group_id = group_id or consumer_group_id(GROUP)
        self.state_dir = (
            state_dir or self.config.state_dir or settings.data_dir / "workers" / GROUP / "windows"
        )
        self.on_anomaly = on_anomaly
        self.states: dict[int, PartitionState] = {}
        self.at_end: set[int] = set()
        self.processed = 0
        self.anomalies = 0
        self._stop = threading.Event()
        self._started = threading.Event()
        self._consumer: Any = None
        self._producer: Any = None
        self._store: WindowStore | None = None
        self._delivery_errors: list[str] = []
        self._last_checkpoint = time.monotonic()
        self._events_in = EVENTS_IN.labels(GROUP, source_topic)

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to checkpoint and return (thread-safe)."""
        self._stop.set()

    @property
    def assigned(self) -> bool:
        """True once partitions are assigned (tests wait for it)."""
        return bool(self.states)

    def _client_config(self) -> dict[str, Any]:
        return self.settings.kafka_client_config()

    def _consumer_config(self) -> dict[str, Any]:
        conf = self._client_config()
        conf.update(
            {
                "group.id": self.group_id,
                "client.id": f"{self.group_id}-detector",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "range",
                "session.timeout.ms": self.settings.kafka_session_timeout_ms,
                "heartbeat.interval.ms": max(1000, self.settings.kafka_session_timeout_ms // 5),
                "max.poll.interval.ms": 300_000,
                "fetch.min.bytes": 1,
                "queued.max.messages.kbytes": 65_536,
            }
        )
        return conf

    def _producer_config(self) -> dict[str, Any]:
        conf = profile_config(self.settings, "core")
        conf["statistics.interval.ms"] = 0
        conf["client.id"] = f"{self.group_id}-producer"
        conf["message.max.bytes"] = SNAPSHOT_MAX_BYTES + 65_536
        conf["compression.type"] = "lz4"
        return conf

    def run(self) -> None:
        """Consume until :meth:`stop`; checkpoint and leave the group on the way out."""
        ensure_changelog(
            self._client_config(),
            self.partitions,
            topic=self.changelog_topic,
            replication_factor=self.settings.replication_factor,
        )
        self._store = WindowStore(Path(self.state_dir))
        self._producer = Producer(self._producer_config())
        consumer = self._consumer = Consumer(self._consumer_config())
        consumer.subscribe(
            [self.source_topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self._started.set()
        interval = self.config.commit_interval_s
        batch_size = self.config.batch_size
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
                consumer.close()
            finally:
                self._producer.flush(30)
                self._producer = self._consumer = None
                self._store.close()
                self._store = None

    # -- hot path ----------------------------------------------------------------------------

    def process(self, messages: Sequence[Message]) -> None:
        """Count a batch of messages into the windows of their partitions."""
        states = self.states
        at_end = self.at_end
        cfg = self.rules
        window_ms = cfg.window_ms
        max_ts = time.time_ns() // 1_000_000 + self.config.max_future_s * 1000
        loads = orjson.loads
        counted = late = undecodable = future = duplicates = 0
        last_partition = -1
        state: PartitionState | None = None
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == _EOF:
                    at_end.add(message.partition())
                    continue
                if error.fatal():
                    raise KafkaException(error)
                log.warning("consumer error: %s", error.str())
                continue
            partition = message.partition()
            if partition != last_partition:
                state = states.get(partition)
                last_partition = partition
                at_end.discard(partition)
            if state is None:
                continue
            state.offset = message.offset() + 1
            state.dirty = True
            try:
                envelope = loads(message.value())
                ts = envelope["timestamp"]
                payload = envelope["payload"]
                event_id = envelope["event_id"]
                code = payload["avcc_code"]
                node = payload["platform_node"]
                user = payload["user_hash"]
                event_type = payload["event_type"]
                duration = payload["duration_sec"]
                revenue = payload["revenue_cny"]
                if ts.__class__ is not int:
                    raise TypeError("timestamp must be an integer")
                if ts > max_ts:
                    future += 1
                    continue
                start = ts - ts % window_ms
                agg = state.windows.get(start)
                if agg is None:
                    if start < state.closed_until:
                        late += 1
                        state.late += 1
                        continue
                    agg = state.windows[start] = WindowAgg()
                if len(event_id) == 36 and event_id[14] == "5":
                    # name-based id (partner idempotency key): drop retried copies
                    if any(event_id in ids for ids in state.seen.values()):
                        duplicates += 1
                        continue
                    state.seen.setdefault(start, set()).add(event_id)
                agg.add(cfg, code, node, user, event_type, duration, revenue, event_id)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                undecodable += 1
                continue
            if ts > state.watermark:
                state.watermark = ts
            counted += 1
        self.processed += counted
        if counted:
            self._events_in.inc(counted)
        if late:
            ANOMALY_LATE_EVENTS.inc(late)
        if undecodable:
            ANOMALY_SKIPPED_EVENTS.labels("undecodable").inc(undecodable)
        if future:
            ANOMALY_SKIPPED_EVENTS.labels("future").inc(future)
        if duplicates:
            ANOMALY_SKIPPED_EVENTS.labels("duplicate").inc(duplicates)

    # -- windows -----------------------------------------------------------------------------

    def watermark(self) -> int:
        """The detector's watermark (epoch ms; -1: unknown).

        The minimum over the partitions with unread data; when every partition is at its end of
        log, the maximum. A partition with unread data but no event seen yet keeps it unknown.
        """
        reading: list[int] = []
        for partition, state in self.states.items():
            if partition in self.at_end:
                continue
            if state.watermark < 0:
                return -1
            reading.append(state.watermark)
        if reading:
            return min(reading)
        return max((s.watermark for s in self.states.values()), default=-1)

    def close_windows(self) -> int:
        """Evaluate and forget every window the watermark has passed; returns how many."""
        states = self.states
        watermark = self.watermark()
        if watermark < 0:
            return 0
        window_ms = self.rules.window_ms
        bound = watermark - self.config.lateness_windows * window_ms - window_ms
        closable = bound - bound % window_ms + window_ms if bound >= 0 else 0
        starts = sorted({start for s in states.values() for start in s.windows if start < closable})
        for start in starts:
            parts = [(s, s.windows.pop(start)) for s in states.values() if start in s.windows]
            for s, _ in parts:
                s.seen.pop(start, None)
            merged = merge_windows(agg for _, agg in parts)
            baseline = merge_baselines((s.baseline for s in states.values()), codes=merged.codes)
            findings = evaluate_window(merged, baseline, self.rules)
            log.debug(
                "window %d closed: %d events from %d partitions, %d findings, watermark %d",
                start,
                merged.events,
                len(parts),
                len(findings),
                watermark,
            )
            self._emit(findings, start, start + window_ms, sorted(s.partition for s, _ in parts))
            contributed = {s.partition: agg for s, agg in parts}
            for s in states.values():
                update_baseline(s.baseline, contributed.get(s.partition), start, self.rules, baseline.codes)
                s.dirty = True
        for s in states.values():
            if s.closed_until < closable:
                s.closed_until = closable
                s.dirty = True
        ANOMALY_WATERMARK.set(watermark)
        ANOMALY_OPEN_WINDOWS.set(sum(len(s.windows) for s in states.values()))
        return len(starts)

    def _emit(self, findings: Iterable[Any], start: int, end: int, partitions: list[int]) -> None:
        producer = self._producer
        for finding in findings:
            try:
                anomaly = to_anomaly(finding, start, end)
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
                self.on_anomaly(anomaly.model_dump(mode="json") | {"source_partitions": partitions})

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._delivery_errors.append(f"{message.topic()}[{message.partition()}]: {error.str()}")

    # -- durability ----------------------------------------------------------------------------

    def _flush(self, what: str) -> None:
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
        store = self._store
        assert store is not None
        max_pairs = self.config.snapshot_max_pairs
        for state in changed:
            snapshot = state.to_bytes(max_pairs)
            store.put(state.partition, snapshot)
            self._producer.produce(
                self.changelog_topic,
                snapshot,
                str(state.partition).encode(),
                partition=state.partition,
                on_delivery=self._on_delivery,
            )
        # 2. snapshots acknowledged (acks=all) before the commit
        self._flush("window snapshots")
        offsets = [TopicPartition(self.source_topic, s.partition, s.offset) for s in changed]
        self._consumer.commit(offsets=offsets, asynchronous=False)
        for state in changed:
            state.dirty = False
        ANOMALY_CHECKPOINT_SECONDS.observe(time.perf_counter() - started)
        return len(changed)

    def _restore(self, partitions: list[int]) -> dict[int, PartitionState]:
        store = self._store
        assert store is not None
        committed = {
            tp.partition: tp.offset
            for tp in self._consumer.committed(
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
            snapshots = read_changelog(self._client_config(), need_changelog, topic=self.changelog_topic)
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

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        states = self._restore(numbers)
        assignment = []
        for tp in partitions:
            state = states[tp.partition]
            offset = state.offset if state.offset is not None else tp.offset
            assignment.append(TopicPartition(tp.topic, tp.partition, offset))
            self.states[tp.partition] = state
        self.at_end.difference_update(numbers)
        consumer.assign(assignment)
        log.info("anomaly: assigned partitions %s", numbers)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        try:
            self.checkpoint(numbers)
        finally:
            self._forget(numbers)
        log.info("anomaly: revoked partitions %s", numbers)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        self._forget(numbers)
        log.warning("anomaly: lost partitions %s (state is restored by their next owner)", numbers)

    def _forget(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self.states.pop(partition, None)
            self.at_end.discard(partition)


# --- the faust app of the anomaly group --------------------------------------------------------

app: faust.App = get_app(GROUP)
# The detector has its own consumer in group avcc-anomaly; faust's consumer (another assignor)
# must not join that group, and its producer would be unused. The web server still runs.
app.boot_strategy = app.BootStrategy(app, enable_kafka=False)

#: The running detector (set while the service runs), for /ready and the lag export.
_running: list[AnomalyDetector] = []


def _assigned() -> list[tuple[str, int]]:
    if not _running:
        raise RuntimeError("the anomaly detector is not running")
    return [(PLAYBACK_EVENT.name, p) for p in list(_running[0].states)]


install_common_views(app, GROUP, assignment=_assigned)


@app.service
class AnomalyService(mode.Service):
    """Runs :class:`AnomalyDetector` in a thread for the worker's lifetime.

    A crash of the loop (e.g. the changelog is unwritable) crashes the service, so the worker
    stops instead of consuming without durable state. Stopping waits for the loop's final
    checkpoint (at most ``stop_timeout_s``).
    """

    stop_timeout_s: float = 60.0
    detector: AnomalyDetector | None = None
    _thread: threading.Thread | None = None

    async def on_start(self) -> None:
        loop = asyncio.get_running_loop()
        detector = self.detector = AnomalyDetector(get_settings())
        _running[:] = [detector]

        def main() -> None:
            try:
                detector.run()
            except Exception as exc:
                log.exception("anomaly detector crashed")
                asyncio.run_coroutine_threadsafe(self.crash(exc), loop)

        self._thread = threading.Thread(target=main, name="anomaly-detector", daemon=False)
        self._thread.start()

    async def on_stop(self) -> None:
        _running.clear()
        if self.detector is not None:
            self.detector.stop()
        thread = self._thread
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, self.stop_timeout_s)
            if thread.is_alive():
                log.error("anomaly detector did not stop within %.0f s", self.stop_timeout_s)
