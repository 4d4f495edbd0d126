"""The offset check every message of a core group passes: next in line, or a decision that is
logged, counted and never a silent skip (each case below was seen with faust's own acking)."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from app.platform.faust.cursor import TAIL_RESEEK_S, Cursors
from app.platform.metrics import REGISTRY

TOPIC = "topic.avcc.apply.created"


class FakeSource:
    """A consumer: what is assigned, committed, still held, sought; clocked by the test."""

    def __init__(self, *partitions: int, committed: dict[int, int] | None = None, earliest: int = 0) -> None:
        self.assignment = {TP(TOPIC, p) for p in partitions}
        self.committed = {TP(TOPIC, p): o for p, o in (committed or {}).items()}
        self.first = earliest
        self.sought: list[tuple[int, int]] = []
        self.ends: dict[TP, int] = {}
        self.lookups = 0

    def assigned(self) -> set[TP]:
        return set(self.assignment)

    async def starts(self, tps: Iterable[TP]) -> dict[TP, int]:
        self.lookups += 1
        return {tp: self.committed.get(tp, self.first) for tp in tps}

    async def earliest(self, tp: TP) -> int:
        return self.first

    async def seek(self, tp: TP, offset: int) -> None:
        self.sought.append((tp.partition, offset))

    def highwater(self, tp: TP) -> int | None:
        return self.ends.get(tp)


def event(partition: int, offset: int) -> Any:
    return SimpleNamespace(message=SimpleNamespace(tp=TP(TOPIC, partition), offset=offset))


def offsets(events: list[Any]) -> list[tuple[int, int]]:
    return [(e.message.tp.partition, e.message.offset) for e in events]


def decisions(name: str, decision: str) -> float:
    value = REGISTRY.get_sample_value(
        "avcc_consumer_offset_decisions_total", {"agent": name, "topic": TOPIC, "decision": decision}
    )
    return value or 0.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_processing_starts_at_the_committed_offset_and_follows_in_order() -> None:
    source = FakeSource(0, 1, committed={0: 5})
    cursors = Cursors("in-order", frozenset({TOPIC}), source)
    admitted = await cursors.admit([event(0, 5), event(1, 0), event(0, 6), event(1, 1)])
    assert offsets(admitted) == [(0, 5), (1, 0), (0, 6), (1, 1)]
    assert cursors.positions() == {TP(TOPIC, 0): 7, TP(TOPIC, 1): 2}
    assert source.lookups == 1
    assert offsets(await cursors.admit([event(0, 7)])) == [(0, 7)]
    assert source.lookups == 1  # learned once


async def test_a_redelivery_below_the_next_offset_is_dropped_and_counted() -> None:
    source = FakeSource(0, committed={0: 3})
    cursors = Cursors("redelivered", frozenset({TOPIC}), source)
    await cursors.admit([event(0, 3), event(0, 4)])
    before = decisions("redelivered", "redelivered")
    assert offsets(await cursors.admit([event(0, 3), event(0, 4), event(0, 5)])) == [(0, 5)]
    assert decisions("redelivered", "redelivered") - before == 2
    assert source.sought == []


async def test_a_jump_is_not_processed_but_fetched_again_from_the_next_offset() -> None:
    """Seen: ``apply.created[1]`` read 3, then 17; and a position a previous generation left
    ahead of the committed offset (a restarted replica got offsets past its commit)."""
    source = FakeSource(0, 1, committed={0: 3, 1: 0})
    cursors = Cursors("jump", frozenset({TOPIC}), source)
    admitted = await cursors.admit([event(0, 3), event(0, 17), event(1, 0), event(0, 18), event(0, 4)])
    assert offsets(admitted) == [(0, 3), (1, 0)]  # the rest of partition 0 waits for the refetch
    assert source.sought == [(0, 4)]
    assert cursors.next_offset(TP(TOPIC, 0)) == 4
    assert offsets(await cursors.admit([event(0, 4), event(0, 5)])) == [(0, 4), (0, 5)]


async def test_offsets_retention_deleted_are_jumped_over_and_counted_as_lost() -> None:
    source = FakeSource(0, committed={0: 2}, earliest=10)
    cursors = Cursors("retention", frozenset({TOPIC}), source)
    before = decisions("retention", "lost_to_retention")
    assert offsets(await cursors.admit([event(0, 10), event(0, 11)])) == [(0, 10), (0, 11)]
    assert decisions("retention", "lost_to_retention") - before == 8
    assert source.sought == []


async def test_messages_of_partitions_not_assigned_are_not_processed() -> None:
    source = FakeSource(0)
    cursors = Cursors("unassigned", frozenset({TOPIC}), source)
    assert offsets(await cursors.admit([event(0, 0), event(3, 0)])) == [(0, 0)]
    source.assignment.clear()  # revoked after the fetch
    assert await cursors.admit([event(0, 1)]) == []


async def test_a_forgotten_partition_starts_again_at_its_committed_offset() -> None:
    source = FakeSource(0, committed={0: 0})
    cursors = Cursors("forget", frozenset({TOPIC}), source)
    await cursors.admit([event(0, 0), event(0, 1)])
    cursors.forget([TP(TOPIC, 0)])
    source.committed[TP(TOPIC, 0)] = 1  # the new owner committed only the first
    assert offsets(await cursors.admit([event(0, 2), event(0, 1)])) == []
    assert source.sought == [(0, 1)]


async def test_a_lost_tail_is_fetched_again_once_it_stayed_behind_the_end() -> None:
    """Seen: the last message of a partition read during a rebalance and never delivered, so
    the record stayed ``submitted`` with nothing after it to reveal the gap."""
    clock = Clock()
    source = FakeSource(0, 1, committed={0: 4, 1: 0})
    cursors = Cursors("tail", frozenset({TOPIC}), source, clock=clock)
    await cursors.watch_tails()  # learns the starts of partitions that delivered nothing
    assert cursors.positions() == {TP(TOPIC, 0): 4, TP(TOPIC, 1): 0}
    source.ends = {TP(TOPIC, 0): 5, TP(TOPIC, 1): 0}
    await cursors.watch_tails()
    clock.now = TAIL_RESEEK_S - 1
    await cursors.watch_tails()
    assert source.sought == []
    clock.now = TAIL_RESEEK_S
    await cursors.watch_tails()
    assert source.sought == [(0, 4)]
    await cursors.admit([event(0, 4)])
    clock.now = 3 * TAIL_RESEEK_S
    await cursors.watch_tails()
    assert source.sought == [(0, 4)]  # caught up: nothing more
