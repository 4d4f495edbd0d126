"""Replay protection across replicas: the shared nonce store on a real broker, and the same signed
request sent to two replicas of the code group."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from app.platform.errors import DependencyUnavailable
from app.platform.http import nonces
from app.platform.http.auth import sign_request
from app.platform.http.nonces import NonceLedger
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import NONCES, TOPIC_PLAN
from app.servers import KafkaKRaftBroker
from tests.integration.stack import API_KEY, API_SECRET, Stack, application

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _ready(*ledgers: NonceLedger, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for ledger in ledgers:
        ledger.start()
        while not ledger.ready:
            assert time.monotonic() < deadline, "nonce ledger never caught up"
            await asyncio.sleep(0.05)


async def test_each_nonce_is_accepted_by_exactly_one_of_two_replicas(
    broker: KafkaKRaftBroker, unique: str
) -> None:
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}", nonce_store="kafka")
    topic = dataclasses.replace(NONCES, name=f"{NONCES.name}.{unique}")
    apply_plan(settings, [topic])
    first = NonceLedger(settings, topic=topic.name, client_id=f"replica-a-{unique}")
    second = NonceLedger(settings, topic=topic.name, client_id=f"replica-b-{unique}")
    late: NonceLedger | None = None
    try:
        await _ready(first, second)
        now = now_ms()
        pairs = [(f"partner-{i % 3}", f"nonce-{uuid.uuid4().hex}") for i in range(150)]
        verdicts = await asyncio.gather(
            *(ledger.claim(key, nonce, now, now) for key, nonce in pairs for ledger in (first, second))
        )
        for i in range(len(pairs)):
            pair = sorted(verdicts[2 * i : 2 * i + 2], key=str)
            assert pair == [None, "replayed_nonce"], (pairs[i], pair)

        # a replica started later reads the window back: no earlier nonce is new to it
        late = NonceLedger(settings, topic=topic.name, client_id=f"replica-c-{unique}")
        await _ready(late)
        again = await asyncio.gather(*(late.claim(key, nonce, now, now_ms()) for key, nonce in pairs[:20]))
        assert again == ["replayed_nonce"] * 20

        latencies = []
        for _ in range(50):
            start = time.perf_counter()
            assert await first.claim("partner-0", f"nonce-{uuid.uuid4().hex}", now_ms(), now_ms()) is None
            latencies.append((time.perf_counter() - start) * 1000)
        latencies.sort()
        print(
            f"\nnonce claim on {broker.name}: p50 {statistics.median(latencies):.1f} ms, "
            f"p99 {latencies[int(len(latencies) * 0.99) - 1]:.1f} ms"
        )
    finally:
        for ledger in (first, second, late):
            if ledger is not None:
                ledger.stop()


async def _until(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:g}s"
        await asyncio.sleep(0.05)


async def test_idle_readers_pause_and_a_replay_is_still_refused_after_idling(
    broker: KafkaKRaftBroker, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers nobody claims through stop fetching (an idle reader's fetches cost CPU for nothing);
    a claim wakes its own reader at once, and the other replica, idle meanwhile, still reads that
    claim before its own: the replay is refused.

    A paused reader's periodic read comes only every :data:`LONG_POLL_S` here, so a claim that
    completes at all (within the test's deadline, far shorter) was completed by the wake-up."""
    monkeypatch.setattr(nonces, "READER_IDLE_POLL_S", LONG_POLL_S)
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}", nonce_store="kafka")
    topic = dataclasses.replace(NONCES, name=f"{NONCES.name}.{unique}")
    apply_plan(settings, [topic])
    first = NonceLedger(settings, topic=topic.name, client_id=f"idle-a-{unique}")
    second = NonceLedger(settings, topic=topic.name, client_id=f"idle-b-{unique}")
    try:
        await _ready(first, second)
        await _until(lambda: first.idle_pauses >= 1 and second.idle_pauses >= 1, "both readers idle")

        for round_ in range(3):
            pauses = (first.idle_pauses, second.idle_pauses)
            now = now_ms()
            nonce = f"nonce-{uuid.uuid4().hex}"
            # woken by its claim, not by the next periodic read (LONG_POLL_S away)
            verdict = await asyncio.wait_for(first.claim("partner-0", nonce, now, now), WAKE_DEADLINE_S)
            assert verdict is None, round_
            assert await second.claim("partner-0", nonce, now, now_ms()) == "replayed_nonce", round_
            await _until(
                lambda p=pauses: first.idle_pauses > p[0] and second.idle_pauses > p[1],
                f"both readers idle again (round {round_})",
            )
    finally:
        first.stop()
        second.stop()


async def test_a_reader_that_goes_silent_is_replaced_and_resumes_where_it_had_read(
    broker: KafkaKRaftBroker, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's consumer that stops returning messages (librdkafka left a partition unfetched
    after a broker restart: CI17, every claim of the code worker timed out for 3 minutes) is
    replaced after the first claim the broker acknowledged and the reader did not read back; the
    new consumer resumes at the old one's position, and no verdict is lost on the way."""
    consumers: list[Consumer] = []
    silent: set[int] = set()
    #: (index of the consumer, partition -> offset) of each assignment
    assignments: list[tuple[int, dict[int, int]]] = []

    class SilencedConsumer(Consumer):  # type: ignore[misc]
        """A real consumer that can go silent: no message, no error."""

        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__(config)
            self.index = len(consumers)
            self.quiet_polls = 0
            consumers.append(self)

        def assign(self, partitions: list[TopicPartition]) -> None:
            assignments.append((self.index, {tp.partition: tp.offset for tp in partitions}))
            super().assign(partitions)

        def poll(self, timeout: float = -1) -> Any:
            if self.index in silent:
                time.sleep(max(timeout, 0))
                self.quiet_polls += 1
                return None
            return super().poll(timeout)

        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
            return [] if self.index in silent else super().consume(num_messages=num_messages, timeout=timeout)

    monkeypatch.setattr(nonces, "Consumer", SilencedConsumer)
    monkeypatch.setattr(nonces, "CLAIM_TIMEOUT_S", 2.0)
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}", nonce_store="kafka")
    topic = dataclasses.replace(NONCES, name=f"{NONCES.name}.{unique}")
    apply_plan(settings, [topic])
    ledger = NonceLedger(settings, topic=topic.name, client_id=f"silenced-{unique}")
    try:
        await _ready(ledger)
        now = now_ms()
        assert await ledger.claim("partner-0", "read-before", now, now) is None
        # the consumer reading now: an earlier one may have failed before its assignment (a
        # new topic not in its metadata yet) and been replaced by the reader's own restart
        reading, _ = assignments[-1]
        silent.add(reading)
        # a poll already under way when it went silent may still return the next claim
        await _until(lambda: consumers[reading].quiet_polls > 0, "the reader's consumer silent")
        with pytest.raises(DependencyUnavailable):
            await ledger.claim("partner-0", "unanswered", now, now_ms())
        await _until(
            lambda: ledger.renewals == 1 and assignments[-1][0] > reading, "the reader's consumer replaced"
        )
        assert await ledger.claim("partner-0", "after", now, now_ms()) is None
        # the unanswered claim is in the log, and the new consumer read it: burnt, as a 503 says
        assert await ledger.claim("partner-0", "unanswered", now, now_ms()) == "replayed_nonce"
        assert await ledger.claim("partner-0", "read-before", now, now_ms()) == "replayed_nonce"
    finally:
        ledger.stop()
    assert ledger.renewals == 1 and len(consumers) == reading + 2
    (silenced, first), (_, second) = assignments[-2:]
    assert silenced == reading, "the silenced consumer was assigned once, right before its successor"
    moved = {p: (first[p], second[p]) for p in first if first[p] != second[p]}
    assert [after - before for before, after in moved.values()] == [1], (
        f"the new consumer should start one past the claim read before, elsewhere as the first: {moved}"
    )


#: A paused reader's periodic read interval in the idle test: far beyond its deadline for a claim.
LONG_POLL_S = 600.0
#: How long a claim may take in the idle test (a loaded box); the periodic read would take LONG_POLL_S.
WAKE_DEADLINE_S = 60.0


@pytest.fixture
def two_code_replicas(module_kafka: Any, tmp_path: Path) -> Iterator[Stack]:
    """Two code workers on 127.0.0.1 and 127.0.0.2 (their own broker: on the session's they would
    join the session core stack's code group)."""
    apply_plan(Settings(kafka_url=f"kafka://{module_kafka.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    stack = Stack(module_kafka.bootstrap, tmp_path)
    try:
        stack.start("code", index=0)
        stack.start("code", index=1)
        yield stack
    finally:
        stack.stop_all()


async def test_the_same_signed_request_is_refused_by_the_second_replica(two_code_replicas: Stack) -> None:
    stack = two_code_replicas
    assert stack.url("code", 0) != stack.url("code", 1)
    path = "/v1/avcc/applications"
    for index in (0, 1):  # both replicas past the rebalance of the second one's arrival
        deadline = time.monotonic() + 90
        while (status := (await stack.call("code", "POST", path, application(), index=index))[0]) != 202:
            assert status == 503 and time.monotonic() < deadline, (status, stack.logs())
            await asyncio.sleep(1)
    body = orjson.dumps(application())
    captured = sign_request("POST", path, body, API_KEY, API_SECRET)
    status, created = await stack.call("code", "POST", path, raw=body, headers=captured, index=0)
    assert status == 202, created
    status, answer = await stack.call("code", "POST", path, raw=body, headers=captured, index=1)
    assert (status, answer["reason"]) == (401, "replayed_nonce"), answer

    # a record request is claimed where it is answered: the owner, reached from either replica
    record = f"/v1/avcc/records/{created['avcc_record_id']}"
    for first, second in ((0, 1), (1, 0), (0, 0)):
        captured = sign_request("GET", record, b"", API_KEY, API_SECRET)
        status, answer = await stack.call("code", "GET", record, headers=captured, index=first)
        assert status in (200, 404), answer
        status, answer = await stack.call("code", "GET", record, headers=captured, index=second)
        assert (status, answer["reason"]) == (401, "replayed_nonce"), (first, second, answer)
