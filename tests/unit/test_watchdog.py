"""The stall watchdog: lag that sits still for ``stall_s`` means a stuck consumer."""

from __future__ import annotations

from app.lag import PartitionOffsets
from app.watchdog import StallWatchdog


def row(partition: int, end: int, committed: int | None) -> PartitionOffsets:
    return PartitionOffsets("avcc-chain", "topic.chain.tx.pending", partition, end, committed)


def test_lag_with_a_frozen_committed_offset_stalls_after_the_threshold() -> None:
    dog = StallWatchdog(stall_s=45)
    assert dog.observe([row(0, 10, 4)], now=0) == []
    assert dog.observe([row(0, 12, 4)], now=44) == []
    assert dog.observe([row(0, 12, 4)], now=45) == [("topic.chain.tx.pending", 0)]


def test_progress_or_no_lag_resets_the_clock() -> None:
    dog = StallWatchdog(stall_s=45)
    dog.observe([row(0, 10, 4)], now=0)
    assert dog.observe([row(0, 10, 5)], now=40) == []  # committed moved
    assert dog.observe([row(0, 10, 5)], now=80) == []  # 40 s since the move
    assert dog.observe([row(0, 10, 10)], now=200) == []  # caught up: no lag
    assert dog.observe([row(0, 10, 10)], now=400) == []


def test_revoked_partitions_are_forgotten() -> None:
    dog = StallWatchdog(stall_s=45)
    dog.observe([row(0, 10, 4), row(1, 10, 4)], now=0)
    dog.observe([row(1, 10, 4)], now=10)
    assert dog.observe([row(0, 10, 4), row(1, 10, 4)], now=50) == [("topic.chain.tx.pending", 1)]
