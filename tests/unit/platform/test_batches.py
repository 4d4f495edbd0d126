"""A batch is made durable in Kafka Streams' order -- outputs acked, then the tables' changelog
writes acked, then local state, then one commit -- and a batch that fails is processed again
whole, its partitions held, except those revoked meanwhile."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP
from pydantic import BaseModel

from app.platform.errors import DependencyUnavailable
from app.platform.faust import batches
from app.platform.faust.batches import Batch, BatchAgent
from app.platform.faust.tables import ModelTable
from app.platform.kafka.producers import Delivery, Outbound

TOPIC = "topic.avcc.apply.created"


class Count(BaseModel):
    n: int


class Store(dict[bytes, bytes]):
    def apply_changelog_batch(self, batch: Any, to_key: Any, to_value: Any) -> None:
        for event in batch:
            self[event.message.key] = event.message.value


class Table:
    def __init__(self) -> None:
        self.data = Store()
        self.changelog_topic = SimpleNamespace(get_topic_name=lambda: "app-counts-changelog")


class Producer:
    """Acks everything, after refusing the first ``refusals`` batches; records the order."""

    def __init__(self, log: list[str], refusals: int = 0) -> None:
        self.log = log
        self.refusals = refusals

    async def send_batch(self, messages: list[Outbound]) -> list[Delivery]:
        if not messages:
            return []
        if self.refusals:
            self.refusals -= 1
            raise DependencyUnavailable("broker away")
        self.log.append("send " + ",".join(str(m.topic) for m in messages))
        return [Delivery(str(m.topic), m.partition or 0, i) for i, m in enumerate(messages)]


class Source:
    def __init__(self, *partitions: int) -> None:
        self.assignment = {TP(TOPIC, p) for p in partitions}

    def assigned(self) -> set[TP]:
        return set(self.assignment)

    async def starts(self, tps: Iterable[TP]) -> dict[TP, int]:
        return dict.fromkeys(tps, 0)

    async def earliest(self, tp: TP) -> int:
        return 0

    async def seek(self, tp: TP, offset: int) -> None:
        raise AssertionError("no seek expected")

    def highwater(self, tp: TP) -> int | None:
        return None


def event(partition: int, offset: int, key: bytes = b"k") -> Any:
    return SimpleNamespace(
        message=SimpleNamespace(tp=TP(TOPIC, partition), partition=partition, offset=offset, key=key)
    )


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches, "RETRY_S", (0.0, 0.0))


def agent(
    log: list[str],
    process: Any,
    producer: Producer,
    source: Source,
    commits: list[dict[TP, int]],
    interval: float = 0.0,
) -> BatchAgent:
    async def commit(offsets: Mapping[TP, int]) -> None:
        log.append("commit")
        commits.append(dict(offsets))

    return BatchAgent(
        SimpleNamespace(conf=SimpleNamespace(id="test")),
        "test",
        [TOPIC],
        process,
        lambda: producer,  # type: ignore[arg-type,return-value]
        commit_interval_s=interval,
        source=source,
        commit=commit,
    )


async def test_outputs_then_state_then_one_commit() -> None:
    log: list[str] = []
    table = ModelTable(Table(), Count)
    commits: list[dict[TP, int]] = []

    async def process(e: Any, batch: Batch) -> None:
        current = table.get("k")  # sees what earlier events of the batch staged
        batch.output(Outbound("out", b"v", b"k"))
        batch.stage([table.write("k", Count(n=(current.n if current else 0) + 1))], e)
        batch.after.append(lambda: log.append("after"))

    worker = agent(log, process, Producer(log), Source(0, 1), commits)
    await worker.handle([event(0, 0), event(1, 0), event(0, 1)])
    assert log == ["send out,out,out", "send app-counts-changelog", "after", "after", "after", "commit"]
    assert table.get("k") == Count(n=3)
    assert commits == [{TP(TOPIC, 0): 2, TP(TOPIC, 1): 1}]


async def test_a_batch_not_made_durable_is_processed_again_whole_and_state_waits() -> None:
    log: list[str] = []
    table = ModelTable(Table(), Count)
    commits: list[dict[TP, int]] = []
    attempts: list[int] = []

    async def process(e: Any, batch: Batch) -> None:
        attempts.append(e.message.offset)
        batch.output(Outbound("out", b"v", b"k"))
        batch.stage([table.write("k", Count(n=e.message.offset))], e)

    worker = agent(log, process, Producer(log, refusals=2), Source(0), commits)
    await worker.handle([event(0, 0), event(0, 1)])
    assert attempts == [0, 1, 0, 1, 0, 1]
    assert log == ["send out,out", "send app-counts-changelog", "commit"]
    assert table.get("k") == Count(n=1)
    assert commits == [{TP(TOPIC, 0): 2}]


async def test_a_processor_that_raises_fails_the_batch_not_the_agent() -> None:
    log: list[str] = []
    commits: list[dict[TP, int]] = []
    calls = {"n": 0}

    async def process(e: Any, batch: Batch) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug, once")
        batch.output(Outbound("out", b"v", b"k"))

    worker = agent(log, process, Producer(log), Source(0), commits)
    await worker.handle([event(0, 0)])
    assert calls["n"] == 2 and commits == [{TP(TOPIC, 0): 1}]


async def test_events_of_a_partition_revoked_while_the_batch_retries_are_given_up() -> None:
    log: list[str] = []
    commits: list[dict[TP, int]] = []
    source = Source(0, 1)
    producer = Producer(log, refusals=1)
    worker: BatchAgent

    async def process(e: Any, batch: Batch) -> None:
        batch.output(Outbound(f"out{e.message.tp.partition}", b"v", b"k"))
        if producer.refusals:  # the broker is away: partition 1 is being revoked meanwhile
            worker._revoking.add(TP(TOPIC, 1))
            source.assignment.discard(TP(TOPIC, 1))

    worker = agent(log, process, producer, source, commits)
    await worker.handle([event(0, 0), event(1, 0)])
    assert log == ["send out0", "commit"]
    assert commits == [{TP(TOPIC, 0): 1}]


async def test_commits_wait_for_the_interval_and_a_revocation_commits_at_once() -> None:
    log: list[str] = []
    commits: list[dict[TP, int]] = []

    async def process(e: Any, batch: Batch) -> None:
        batch.output(Outbound("out", b"v", b"k"))

    worker = agent(log, process, Producer(log), Source(0, 1), commits, interval=3600.0)
    await worker.handle([event(0, 0)])  # the first batch commits (nothing committed yet)
    await worker.handle([event(0, 1), event(1, 0)])
    await worker.handle([event(0, 2)])
    assert commits == [{TP(TOPIC, 0): 1}]
    await worker.revoke([TP(TOPIC, 1)])
    assert commits == [{TP(TOPIC, 0): 1}, {TP(TOPIC, 0): 3, TP(TOPIC, 1): 1}]
    assert worker.cursors.next_offset(TP(TOPIC, 1)) is None  # learned again if it comes back


async def test_keys_run_concurrently_each_in_order() -> None:
    log: list[str] = []
    commits: list[dict[TP, int]] = []
    order: list[tuple[bytes, int]] = []

    async def process(e: Any, batch: Batch) -> None:
        order.append((e.message.key, e.message.offset))

    worker = agent(log, process, Producer(log), Source(0), commits)
    worker.concurrency = 8
    await worker.handle([event(0, 0, b"a"), event(0, 1, b"b"), event(0, 2, b"a"), event(0, 3, b"b")])
    assert [o for k, o in order if k == b"a"] == [0, 2] and [o for k, o in order if k == b"b"] == [1, 3]
    assert commits == [{TP(TOPIC, 0): 4}]
