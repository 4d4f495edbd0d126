"""Durable, shared DLQ operator state (issue 10, part 5), with real ops workers on a real broker.

Dead letters (with the failure headers the runtime writes) are handled on two ops replicas bound to
127.0.0.2 and 127.0.0.3: re-injected and discarded through the real ``avcc dlq`` CLI. Both replicas
must print the same list, statuses and audit trails; a re-injection raced on both replicas must be
produced exactly once; and after one replica's data directory is deleted and the worker restarted,
``avcc dlq list``/``show`` print exactly what they printed before.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from base64 import b64encode
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from app.platform.groups import group_spec
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import DLQ, TOPIC_PLAN
from app.servers import KafkaKRaftBroker
from schemas.system import FailureMetadata
from tables.ops import DLQ_STORE_DIR
from tests.integration.stack import ROOT, Stack, create_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

OPERATOR = ("operator", "operator-pass")
#: The two ops replicas' stack indexes: hosts 127.0.0.2 and 127.0.0.3.
A, B = 1, 2
EVENTS = 7


def _dead_letters(bootstrap: str, original_topic: str) -> list[str]:
    """Produce EVENTS dead letters of ``original_topic`` to the DLQ; returns their event ids."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    now = int(time.time() * 1000)
    ids = []
    for n in range(EVENTS):
        event_id = f"ev-{uuid.uuid4().hex[:8]}-{n}"
        meta = FailureMetadata(
            original_topic=original_topic,
            original_partition=n % 3,
            original_offset=100 + n,
            original_timestamp_ms=now - 5000,
            original_key=f"key-{n}",
            consumer_group="review",
            attempt=8,
            first_failure_ms=now - 4000,
            last_failure_ms=now - 1000 + n,
            error_class="app.platform.errors.DependencyTimeout",
            error_message=f"dependency timed out ({n})",
            stacktrace="Traceback (most recent call last):\nDependencyTimeout: timed out",
            event_id=event_id,
        )
        value = orjson.dumps({"event_id": event_id, "payload": {"n": n}})
        producer.produce(DLQ.name, value, f"key-{n}".encode(), headers=meta.to_headers())
        ids.append(event_id)
    assert producer.flush(30) == 0
    return ids


@pytest.fixture(scope="module")
def ops_pair(module_kafka: KafkaKRaftBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two ops workers (127.0.0.2, 127.0.0.3) on the module's own broker."""
    settings = Settings(kafka_url=f"kafka://{module_kafka.bootstrap}")
    apply_plan(settings, [*TOPIC_PLAN, *changelog_specs([group_spec("ops")])])
    stack = Stack(
        module_kafka.bootstrap,
        tmp_path_factory.mktemp("ops-state"),
        env={"AVCC_OPERATOR_USERS": json.dumps({OPERATOR[0]: OPERATOR[1]})},
    )
    try:
        stack.start("ops", index=A)
        stack.start("ops", index=B)
        yield stack
    finally:
        stack.stop_all()


def avcc(stack: Stack, index: int, *args: str) -> tuple[int, str]:
    """Run the real ``avcc`` CLI against ops replica ``index``; ``(exit code, stdout)``."""
    env = {
        **stack.env,
        "AVCC_WEB_HOST": stack.host(index),
        "AVCC_WEB_PORT": str(stack.ports[("ops", index)]),
        "AVCC_OPERATOR": ":".join(OPERATOR),
    }
    done = subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout + done.stderr


def listing(stack: Stack, index: int, topic: str) -> str:
    """``avcc dlq list --topic`` of one replica (must succeed)."""
    code, out = avcc(stack, index, "dlq", "list", "--topic", topic)
    assert code == 0, out
    return out


def statuses(out: str) -> dict[str, str]:
    """``{dlq_id: status}`` from ``avcc dlq list`` output."""
    rows = [line.split() for line in out.splitlines()[1:-1]]
    return {row[0]: row[1] for row in rows}


def shown(stack: Stack, index: int, dlq_id: str) -> str:
    """``avcc dlq show`` of one replica (must succeed)."""
    code, out = avcc(stack, index, "dlq", "show", dlq_id)
    assert code == 0, out
    return out


def post(stack: Stack, index: int, path: str, body: dict[str, Any]) -> int:
    """A JSON POST to a replica's console; the HTTP status."""
    request = urllib.request.Request(
        f"http://{stack.host(index)}:{stack.ports[('ops', index)]}{path}",
        data=orjson.dumps(body),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + b64encode(":".join(OPERATOR).encode()).decode(),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def reinjected_events(bootstrap: str, topic: str) -> list[str]:
    """Event ids of every message in ``topic`` (what re-injection produced)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        found: list[str] = []
        for partition in range(3):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if high <= 0:
                continue
            consumer.assign([TopicPartition(topic, partition, 0)])
            read = 0
            deadline = time.monotonic() + 30
            while read < high and time.monotonic() < deadline:
                for message in consumer.consume(100, 1.0):
                    if message.error() is None:
                        found.append(orjson.loads(message.value())["event_id"])
                        read += 1
        return found
    finally:
        consumer.close()


def test_dlq_state_is_shared_by_replicas_and_survives_a_lost_disk(
    ops_pair: Stack, module_kafka: KafkaKRaftBroker
) -> None:
    stack = ops_pair
    original = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(module_kafka.bootstrap, original, 3)
    events = _dead_letters(module_kafka.bootstrap, original)

    def all_indexed(index: int) -> dict[str, str] | None:
        found = statuses(listing(stack, index, original))
        return found if len(found) == EVENTS else None

    ids = sorted(wait_for(lambda: all_indexed(A), 90, 1.0))
    wait_for(lambda: all_indexed(B), 90, 1.0)
    by_event = {}
    for dlq_id in ids:
        text = shown(stack, A, dlq_id)
        by_event[next(e for e in events if e in text)] = dlq_id
    first, second, junk, noise, raced, untouched, contested = (by_event[e] for e in events)

    # actions on both replicas, through the CLI
    code, out = avcc(stack, A, "dlq", "reinject", first, second, "--operator", "alice")
    assert code == 0 and out.count("reinjected ") == 2, out
    code, out = avcc(stack, A, "dlq", "discard", junk, "--operator", "alice", "--reason", "test data")
    assert code == 0, out
    started = time.monotonic()
    assert post(stack, B, f"/dlq/{noise}/discard", {"operator": "bob", "reason": "known noise"}) == 200
    print(f"discard on replica B answered in {time.monotonic() - started:.3f}s")
    # discarding what the other replica already re-injected is refused there too
    code, out = avcc(stack, B, "dlq", "discard", first, "--operator", "bob", "--reason", "late")
    assert code == 1 and "only new" in out, out

    # the same re-injection sent to both replicas at once: the loser of the race is refused (409);
    # if one ran entirely before the other, both may re-inject (within the cap). Either way every
    # produced copy is one accepted action with one audit line, on both replicas.
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(lambda i: post(stack, i, f"/dlq/{raced}/reinject", {"operator": f"op{i}"}), (A, B))
        )
    assert sorted(answers) in ([200, 409], [200, 200]), answers
    accepted = answers.count(200)
    print(f"concurrent re-injection answers: {answers} in {time.monotonic() - started:.3f}s")
    # the same discard on both replicas at once: exactly one wins, whichever way they interleave
    dup = {"reason": "dup"}
    with ThreadPoolExecutor(2) as pool:
        discards = list(
            pool.map(
                lambda i: post(stack, i, f"/dlq/{contested}/discard", {"operator": f"op{i}", **dup}),
                (A, B),
            )
        )
    assert sorted(discards) == [200, 409], discards

    expected = {first: "reinjected", second: "reinjected", junk: "discarded", noise: "discarded"}
    expected |= {raced: "reinjected", untouched: "new", contested: "discarded"}
    view = wait_for(lambda: (out := listing(stack, A, original)) and statuses(out) == expected and out, 60)
    wait_for(lambda: listing(stack, B, original) == view, 60, 0.5)
    details = {dlq_id: shown(stack, A, dlq_id) for dlq_id in ids}
    for dlq_id in ids:
        assert shown(stack, B, dlq_id) == details[dlq_id]
    assert (
        "alice (via operator) discard test data" in details[junk]
        and "bob (via operator) discard known noise" in details[noise]
    )
    assert "alice (via operator) reinject" in details[first] and "(re-injection 1)" in details[first]
    assert details[raced].count(" reinject ") == accepted and f"re-injections={accepted}/3" in details[raced]
    assert "audit trail:\n  (none)" in details[untouched] and details[contested].count(" discard dup") == 1
    wait_for(lambda: len(reinjected_events(module_kafka.bootstrap, original)) >= 2 + accepted, 30)
    time.sleep(1.0)
    produced = reinjected_events(module_kafka.bootstrap, original)
    assert sorted(produced) == sorted([events[0], events[1], *[events[4]] * accepted]), produced

    # replica A loses its disk: the rebuilt view is the same, on both replicas
    stack.stop("ops", A)
    shutil.rmtree(stack.data_dir("ops", A))
    assert not (stack.data_dir("ops", A) / DLQ_STORE_DIR).exists()
    stack.start("ops", index=A)  # returns once /ready: the rebuilt view must be complete then
    assert listing(stack, A, original) == view
    for dlq_id in ids:
        assert shown(stack, A, dlq_id) == details[dlq_id]

    # and the rebuilt replica acts on the rebuilt state
    code, out = avcc(stack, A, "dlq", "discard", untouched, "--operator", "carol", "--reason", "rebuilt")
    assert code == 0, out
    wait_for(lambda: statuses(listing(stack, B, original)).get(untouched) == "discarded", 60, 0.5)
    assert "carol (via operator) discard rebuilt" in shown(stack, B, untouched)
    assert (stack.data_dir("ops", A) / DLQ_STORE_DIR).is_dir()
