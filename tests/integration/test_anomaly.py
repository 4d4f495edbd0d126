"""Anomaly detector end to end on a real broker: findings with evidence, quiet on uniform traffic,
window state restored from the changelog after a restart."""

from __future__ import annotations

import hashlib
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from app.platform.settings import Settings
from app.playback.anomaly.detector import AnomalyDetector
from app.playback.anomaly.rules import ANOMALY_NAMESPACE
from app.playback.anomaly.settings import AnomalyRuleSettings, AnomalySettings
from schemas.envelope import Envelope
from schemas.system import AnomalyDetected
from tests.integration.reads import end_offsets, wait_committed

pytestmark = pytest.mark.integration

W = 60_000
PER_WINDOW = 3000  # 20 codes x ~150 events


def code(i: int) -> str:
    return f"MA.156.10005.8361/AV2026{i:06d}"


def user(i: int) -> str:
    return "sha256:" + hashlib.sha256(f"user-{i}".encode()).hexdigest()


class Traffic:
    """Envelopes of uniform playback (20 codes, 5 nodes, 500 users) and injected anomalies."""

    def __init__(self, base_ms: int, seed: int = 11) -> None:
        self.base = base_ms
        self.rng = random.Random(seed)

    def _envelope(self, ts: int, code_index: int, user_hash: str | None = None) -> bytes:
        rng = self.rng
        return orjson.dumps(
            {
                "event_id": str(uuid.uuid4()),
                "timestamp": ts,
                "source": "gateway-svc",
                "payload": {
                    "avcc_code": code(code_index),
                    "platform_node": str(8300 + rng.randrange(5)),
                    "user_hash": user_hash or user(rng.randrange(500)),
                    "event_type": "play",
                    "duration_sec": rng.randint(1, 3600),
                    "revenue_cny": "0.00",
                },
            }
        )

    def uniform(self, window: int, count: int = PER_WINDOW) -> Iterator[bytes]:
        start = self.base + window * W
        for i in range(count):
            yield self._envelope(start + i * W // count, self.rng.randrange(20))

    def burst(self, window: int, code_index: int, count: int) -> Iterator[bytes]:
        start = self.base + window * W
        for i in range(count):
            yield self._envelope(start + i * W // count, code_index)

    def replay(self, window: int, code_index: int, count: int) -> Iterator[bytes]:
        start = self.base + window * W
        for i in range(count):
            yield self._envelope(start + i * W // count, code_index, user(10**6))

    def ticks(self, window: int) -> Iterator[bytes]:
        """A few events far enough ahead to close every window before ``window`` - 1."""
        for i in range(48):
            yield self._envelope(self.base + window * W + i, i % 20)


class Setup:
    def __init__(self, broker: Any, unique: str, tmp_path: Path) -> None:
        self.bootstrap = broker.bootstrap
        self.source = f"playback-{unique}"
        self.anomalies = f"anomaly-{unique}"
        self.changelog = f"anomaly-changelog-{unique}"
        self.partials = f"anomaly-partials-{unique}"
        self.merge_changelog = f"anomaly-merge-changelog-{unique}"
        self.group = f"anomaly-{unique}"
        self.tmp = tmp_path
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        topics = [NewTopic(self.source, 24, 1), NewTopic(self.anomalies, 6, 1)]
        for future in admin.create_topics(topics, operation_timeout=30).values():
            future.result(timeout=30)
        self.settings = Settings(kafka_url=f"kafka://{self.bootstrap}", kafka_session_timeout_ms=6000)
        self.config = AnomalySettings(lateness_windows=1, commit_interval_s=0.5)
        self.rules = AnomalyRuleSettings(window_s=60, share_min_count=100)
        self.produced = 0

    def produce(self, *streams: Iterator[bytes]) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        for stream in streams:
            for value in stream:
                key = orjson.loads(value)["event_id"].encode()  # as the gateway keys them
                producer.produce(self.source, value, key)
                self.produced += 1
                producer.poll(0)
        assert producer.flush(30) == 0

    def detector(self, state_dir: str) -> tuple[AnomalyDetector, list[dict[str, Any]], threading.Thread]:
        found: list[dict[str, Any]] = []
        detector = AnomalyDetector(
            self.settings,
            self.config,
            rules=self.rules,
            source_topic=self.source,
            anomaly_topic=self.anomalies,
            changelog_topic=self.changelog,
            partials_topic=self.partials,
            merge_changelog_topic=self.merge_changelog,
            group_id=self.group,
            state_dir=self.tmp / state_dir,
            on_anomaly=found.append,
        )
        thread = threading.Thread(target=detector.run, name=f"detector-{state_dir}")
        thread.start()
        return detector, found, thread

    def anomaly_events(self, expected: int, timeout_s: float = 20.0) -> list[tuple[bytes, bytes]]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"check-{uuid.uuid4().hex}"})
        consumer.assign([TopicPartition(self.anomalies, p, 0) for p in range(6)])
        found: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(found) < expected:
            found += [(m.key(), m.value()) for m in consumer.consume(100, timeout=0.3) if m.error() is None]
        consumer.close()
        return found


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def base_ms() -> int:
    return (int(time.time() * 1000) - 3 * 3600 * 1000) // W * W


def test_burst_and_replay_found_with_evidence_uniform_traffic_quiet(
    broker: Any, unique: str, tmp_path: Path, base_ms: int
) -> None:
    setup = Setup(broker, unique, tmp_path)
    traffic = Traffic(base_ms)
    setup.produce(
        *(traffic.uniform(w) for w in range(6)),
        traffic.burst(5, code_index=0, count=1500),  # ~10x the code's ~150 per window
        traffic.replay(5, code_index=1, count=60),
        traffic.ticks(9),
    )
    detector, found, thread = setup.detector("a")
    try:
        wait_for(lambda: detector.processed >= setup.produced, 45, "all events consumed")
        wait_for(lambda: len(found) >= 2, 60, "two findings")
        time.sleep(1.0)  # nothing else may show up
    finally:
        detector.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert sorted(f["rule"] for f in found) == ["traffic_spike", "user_replay"], found
    assert {f["window_start_ms"] for f in found} == {base_ms + 5 * W}  # windows 0-4: uniform, no finding

    spike = next(f for f in found if f["rule"] == "traffic_spike")
    assert spike["avcc_code"] == code(0)
    assert spike["observed"] >= 1500 and spike["baseline"] == pytest.approx(150, rel=0.2)
    assert spike["threshold"] == pytest.approx(5 * spike["baseline"], rel=1e-3)
    assert spike["evidence"]["code_events"] == spike["observed"] and spike["evidence"]["window_s"] == 60
    replay = next(f for f in found if f["rule"] == "user_replay")
    assert (replay["avcc_code"], replay["user_hash"], replay["observed"]) == (code(1), user(10**6), 60.0)

    events = setup.anomaly_events(2)
    assert len(events) == 2
    for key, value in events:
        envelope = Envelope[AnomalyDetected].model_validate_json(value)
        payload = envelope.payload
        assert key == (payload.avcc_code or "").encode()
        assert str(envelope.event_id) == payload.anomaly_id
        rule_key = (
            payload.avcc_code
            if payload.rule == "traffic_spike"
            else f"{payload.avcc_code}|{payload.user_hash}"
        )
        expected_id = uuid.uuid5(ANOMALY_NAMESPACE, f"{payload.rule}|{rule_key}|{payload.window_start_ms}")
        assert payload.anomaly_id == str(expected_id)
        assert payload.window_end_ms - payload.window_start_ms == W


def test_window_state_restored_from_changelog_after_restart(
    broker: Any, unique: str, tmp_path: Path, base_ms: int
) -> None:
    """The spike in window 5 needs the history of windows 0-4: found only if state survived."""
    setup = Setup(broker, unique, tmp_path)
    traffic = Traffic(base_ms, seed=12)
    setup.produce(*(traffic.uniform(w) for w in range(4)))
    first, found_first, thread = setup.detector("first")
    try:
        wait_for(lambda: first.processed >= setup.produced, 45, "phase 1 consumed")
        # a checkpoint after the last event: snapshots acknowledged, then the offsets committed
        wait_committed(setup.bootstrap, setup.group, setup.source, end_offsets(setup.bootstrap, setup.source))
    finally:
        first.stop()
        thread.join(30)
    assert found_first == []
    phase_one = setup.produced

    setup.produce(
        traffic.uniform(4), traffic.uniform(5), traffic.burst(5, code_index=4, count=1500), traffic.ticks(9)
    )
    # a fresh local store: the state can only come from the changelog
    second, found, thread = setup.detector("second")
    try:
        wait_for(lambda: second.processed >= setup.produced - phase_one, 45, "phase 2 consumed")
        wait_for(lambda: len(found) >= 1, 60, "the spike")
        time.sleep(1.0)
    finally:
        second.stop()
        thread.join(30)
    assert second.processed == setup.produced - phase_one  # resumed at the snapshot offsets
    assert [(f["rule"], f["avcc_code"], f["window_start_ms"]) for f in found] == [
        ("traffic_spike", code(4), base_ms + 5 * W)
    ]
    assert found[0]["baseline"] == pytest.approx(150, rel=0.2)
