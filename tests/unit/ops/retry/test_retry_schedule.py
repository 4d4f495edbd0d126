"""Retry forwarder bookkeeping: per-partition holds, due partitions, poll timeout, arrivals."""

from __future__ import annotations

from app.ops.retry.schedule import MAX_POLL_S, MAX_REWINDS, PartitionHolds

TP = ("topic.system.retry", 0)
OTHER = ("topic.system.retry", 1)


def test_held_partition_is_due_at_its_time_and_only_once() -> None:
    holds = PartitionHolds()
    holds.hold(TP, 5, until_ms=1_000)
    holds.hold(OTHER, 9, until_ms=3_000)
    assert holds.take_due(999) == []
    assert holds.take_due(1_000) == [TP]
    assert holds.take_due(1_000) == []
    assert list(holds.paused) == [OTHER]


def test_poll_timeout_waits_for_the_next_due_partition_within_bounds() -> None:
    holds = PartitionHolds()
    assert holds.poll_timeout(0) == MAX_POLL_S
    holds.hold(TP, 5, until_ms=200)
    assert holds.poll_timeout(0) == 0.2
    assert holds.poll_timeout(10_000) == 0.01  # overdue: poll briefly, resume next step
    holds.hold(OTHER, 1, until_ms=60_000)
    assert holds.poll_timeout(0) == 0.2


def test_prefetched_messages_of_a_paused_or_rewound_partition_are_stale() -> None:
    holds = PartitionHolds()
    holds.hold(TP, 5, until_ms=1_000)
    assert holds.arrival(TP, 6) == "stale"  # paused
    holds.take_due(1_000)
    assert holds.arrival(TP, 4) == "stale"  # before the rewind point
    assert holds.arrival(TP, 5) == "in_order"
    assert holds.arrival(OTHER, 0) == "in_order"  # nothing known: every offset is in order


def test_a_lost_seek_is_retried_then_the_held_offset_is_given_up() -> None:
    holds = PartitionHolds()
    holds.hold(TP, 5, until_ms=0)
    for _ in range(MAX_REWINDS - 1):
        holds.take_due(0)
        assert holds.arrival(TP, 6) == "lost_seek"
        holds.hold(TP, 5, until_ms=0)
    holds.take_due(0)
    assert holds.arrival(TP, 6) == "lost_seek"
    holds.hold(TP, 5, until_ms=0)
    holds.take_due(0)
    assert holds.arrival(TP, 6) == "gone"
    assert TP not in holds.rewound


def test_commit_moves_the_expected_offset_and_forget_clears_a_partition() -> None:
    holds = PartitionHolds()
    holds.committed(TP, 8)
    assert holds.arrival(TP, 7) == "stale"
    holds.hold(TP, 8, until_ms=50)
    holds.forget(TP)
    assert (holds.paused, holds.expected, holds.rewound) == ({}, {}, {})
    assert holds.arrival(TP, 3) == "in_order"
