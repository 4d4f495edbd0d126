"""The same playback input gives the same anomalies with 1, 2 and 3 anomaly workers.

Real ``avcc worker anomaly`` processes (each bound to its own loopback address, like pods) on a
fresh Kafka broker per run, so every run starts from the same topics holding the same seeded
events. Done means: the group has committed every
offset of both the source and the partials topic, stably (offsets are committed only after the
anomalies are acknowledged), and then the anomaly topic is read whole.
"""

from __future__ import annotations

import hashlib
import random
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from app.platform.faust.app import consumer_group_id
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import ANOMALY, ANOMALY_WINDOW_PARTIALS, PLAYBACK_EVENT
from app.playback.anomaly.detector import GROUP
from app.servers import KafkaKRaftBroker, ensure_kafka_libs
from schemas.envelope import Envelope
from schemas.system import AnomalyDetected
from testing.ports import free_port_block
from tests.integration.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

W = 60_000
CODES = 20
#: The detector's knobs in every worker: 60 s windows, short checkpoints.
ENV = {
    "AVCC_ANOMALY_WINDOW_S": "60",
    "AVCC_ANOMALY_LATENESS_WINDOWS": "1",
    "AVCC_ANOMALY_COMMIT_INTERVAL_S": "0.5",
    "AVCC_ANOMALY_SHARE_MIN_COUNT": "100",
}
#: A fixed time base: a window start three hours back, whenever the test runs (the detector
#: skips events more than max_future_s ahead of the wall clock, not old ones).
BASE_MS = (int(time.time() * 1000) - 3 * 3600 * 1000) // W * W

Finding = tuple[str, str, str, str, int, float]


def code(i: int) -> str:
    return f"MA.156.10005.8361/AV2026{i:06d}"


def user(i: int) -> str:
    return "sha256:" + hashlib.sha256(f"user-{i}".encode()).hexdigest()


class Input:
    """Seeded envelopes: uniform traffic over 9 windows, anomalies in windows 5-7, then ticks."""

    def __init__(self, seed: int = 10) -> None:
        self.rng = random.Random(seed)
        self.events: list[tuple[int, dict[str, Any]]] = []

    def add(self, ts: int, code_index: int, **payload: Any) -> None:
        rng = self.rng
        self.events.append(
            (
                ts,
                {
                    "event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    "timestamp": ts,
                    "source": "gateway-svc",
                    "payload": {
                        "avcc_code": code(code_index),
                        "platform_node": str(8300 + rng.randrange(5)),
                        "user_hash": user(rng.randrange(500)),
                        "event_type": "play",
                        "duration_sec": rng.randint(1, 3600),
                        "revenue_cny": "0.00",
                    }
                    | payload,
                },
            )
        )

    def spread(self, window: int, count: int, code_index: int | None = None, **payload: Any) -> None:
        start = BASE_MS + window * W
        for i in range(count):
            index = code_index if code_index is not None else self.rng.randrange(CODES)
            self.add(start + i * W // count + self.rng.randrange(50), index, **payload)

    def build(self) -> list[tuple[bytes, bytes]]:
        """(key, value) messages in event-time order (no event is late), keyed like the gateway."""
        for w in range(9):
            self.spread(w, 2000)
        self.spread(5, 1500, code_index=0)  # traffic_spike: ~15x code 0's ~100 per window
        self.spread(5, 24, code_index=1, user_hash=user(10**6))  # 24 plays: under the threshold
        self.spread(6, 40, code_index=1, user_hash=user(10**6))  # user_replay
        self.spread(6, 300, code_index=2, platform_node="8399")  # node_share_jump on a new node
        self.spread(7, 3, code_index=3, duration_sec=200_000)  # impossible_duration
        self.spread(7, 2, code_index=4, event_type="purchase", revenue_cny="25000.00")  # revenue
        for i in range(96):  # ticks in window 10: windows 0-8 close
            self.add(BASE_MS + 10 * W + i, i % CODES)
        self.events.sort(key=lambda item: item[0])
        return [(e["event_id"].encode(), orjson.dumps(e)) for _, e in self.events]


MESSAGES = Input().build()


def produce(bootstrap: str) -> list[int]:
    """Produce the input; the end offset of each source partition (from the delivery reports)."""
    ends = [0] * PLAYBACK_EVENT.partitions

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        ends[message.partition()] = max(ends[message.partition()], message.offset() + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for key, value in MESSAGES:
        producer.produce(PLAYBACK_EVENT.name, value, key, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    return ends


def log_ends(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """The end offset of each partition, read up to the end of partition."""
    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4().hex}", "enable.partition.eof": True}
    )
    reader.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    ends = [0] * partitions
    pending = set(range(partitions))
    deadline = time.monotonic() + 30
    try:
        while pending and time.monotonic() < deadline:
            for message in reader.consume(1000, timeout=0.5):
                if message.error() is not None:
                    pending.discard(message.partition())
                else:
                    ends[message.partition()] = message.offset() + 1
    finally:
        reader.close()
    assert not pending, f"{topic}: no end of partitions {sorted(pending)}"
    return ends


def committed(consumer: Consumer, topic: str, partitions: int) -> list[int]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    return [tp.offset for tp in consumer.committed(tps, timeout=10)]


def wait_done(bootstrap: str, stack: Stack, source_ends: list[int], timeout_s: float = 300.0) -> None:
    """Until the anomaly group has committed the end of both its topics, twice 3 s apart."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": consumer_group_id(GROUP)})
    partials = ANOMALY_WINDOW_PARTIALS
    try:
        deadline = time.monotonic() + timeout_s
        confirmed = 0
        while confirmed < 2:
            if time.monotonic() > deadline:
                raise AssertionError(f"the anomaly group did not finish in {timeout_s} s\n{stack.logs()}")
            time.sleep(3.0)
            done = committed(probe, PLAYBACK_EVENT.name, PLAYBACK_EVENT.partitions) == source_ends and (
                committed(probe, partials.name, partials.partitions)
                == log_ends(bootstrap, partials.name, partials.partitions)
            )
            confirmed = confirmed + 1 if done else 0
    finally:
        probe.close()


def anomalies(bootstrap: str) -> set[Finding]:
    """Every anomaly on the topic, deduplicated by id (the sink does the same)."""
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
        }
    )
    reader.assign([TopicPartition(ANOMALY.name, p, 0) for p in range(ANOMALY.partitions)])
    found: dict[str, Finding] = {}
    pending = set(range(ANOMALY.partitions))
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        for message in reader.consume(200, timeout=0.5):
            if message.error() is not None:
                pending.discard(message.partition())
                continue
            payload = Envelope[AnomalyDetected].model_validate_json(message.value()).payload
            found[payload.anomaly_id] = (
                payload.rule,
                payload.avcc_code or "",
                payload.user_hash or "",
                payload.platform_node or "",
                payload.window_start_ms,
                payload.observed,
            )
    reader.close()
    assert not pending, f"anomaly partitions {sorted(pending)} not read to their end"
    return set(found.values())


def run(root: Path, workers: int) -> tuple[set[Finding], list[int]]:
    """The anomalies ``workers`` anomaly workers find in the input, and each one's partition count."""
    with KafkaKRaftBroker(
        root / "kafka", ensure_kafka_libs(), port=free_port_block((0, 1)), die_with_parent=True
    ) as broker:
        return run_on(broker, root / "workers", workers)


def run_on(broker: KafkaKRaftBroker, root: Path, workers: int) -> tuple[set[Finding], list[int]]:
    """:func:`run` on an empty ``broker``."""
    apply_plan(Settings(kafka_url=f"kafka://{broker.bootstrap}"), [PLAYBACK_EVENT, ANOMALY])
    source_ends = produce(broker.bootstrap)
    assert all(source_ends), f"every source partition gets events: {source_ends}"
    stack = Stack(broker.bootstrap, root, env=ENV)
    try:
        for index in range(workers):
            stack.worker(GROUP, index).start(wait=False)
        for index in range(workers):
            stack.worker(GROUP, index).wait_ready()
        wait_done(broker.bootstrap, stack, source_ends)
        shares = [int(ready(stack, index)["partitions"]) for index in range(workers)]
        found = anomalies(broker.bootstrap)
        assert all(p.returncode is None for p in stack.workers.values()), stack.logs()
    finally:
        stack.stop_all()
    return found, shares


def ready(stack: Stack, index: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"{stack.url(GROUP, index)}/ready", timeout=5) as response:
        body: dict[str, Any] = orjson.loads(response.read())
    return body


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[dict[int, tuple[set[Finding], list[int]]]]:
    yield {n: run(tmp_path / f"run-{n}", n) for n in (1, 2, 3)}


def test_one_two_and_three_workers_find_the_same_anomalies(
    runs: dict[int, tuple[set[Finding], list[int]]],
) -> None:
    (one, one_shares), (two, two_shares), (three, three_shares) = runs[1], runs[2], runs[3]
    # every worker holds its share: 24 source + 12 partials partitions in all
    assert one_shares == [36]
    assert sorted(two_shares) == [18, 18]
    assert sorted(three_shares) == [12, 12, 12]
    assert one == two, sorted(one ^ two)
    assert one == three, sorted(one ^ three)
    by_rule = {rule: (c, u, n, start, observed) for rule, c, u, n, start, observed in one}
    assert sorted(by_rule) == [
        "impossible_duration",
        "node_share_jump",
        "revenue_out_of_bounds",
        "traffic_spike",
        "user_replay",
    ], sorted(one)
    assert len(one) == 5, sorted(one)
    assert by_rule["traffic_spike"][0] == code(0) and by_rule["traffic_spike"][3] == BASE_MS + 5 * W
    assert by_rule["user_replay"][:2] == (code(1), user(10**6))
    assert by_rule["user_replay"][3:] == (BASE_MS + 6 * W, 40.0)
    assert (by_rule["node_share_jump"][0], by_rule["node_share_jump"][2]) == (code(2), "8399")
    assert by_rule["impossible_duration"][3:] == (BASE_MS + 7 * W, 200_000.0)
