"""Nonce arithmetic of the EVM backend: next nonce, gaps, the keeper's repair plan."""

from __future__ import annotations

from app.lifecycle.chain.journal import SentTx
from app.lifecycle.chain.nonces import gaps, next_nonce, plan_repair


def _sent(nonce: int, sent_ms: int = 0) -> SentTx:
    return SentTx(nonce, 1, 21_000, "0x", [f"0x{nonce:02x}"], sent_ms)


def test_next_nonce_passes_the_node_count_and_every_journaled_nonce() -> None:
    assert next_nonce(5, []) == 5
    assert next_nonce(5, [5, 6, 7]) == 8
    assert next_nonce(9, [3, 4]) == 9
    assert next_nonce(0, [0]) == 1


def test_gaps_are_the_nonces_nothing_holds_below_the_highest_journaled_one() -> None:
    assert gaps(10, []) == []
    assert gaps(10, [10, 11, 12]) == []
    assert gaps(10, [11, 14]) == [10, 12, 13]
    assert gaps(10, [3, 4]) == [], "mined nonces are no gaps"


def test_the_repair_orders_waiting_transactions_and_skips_mined_ones() -> None:
    plan = plan_repair(10, {"b": _sent(12), "a": _sent(10), "old": _sent(7)}, now_ms=0, timeout_ms=1_000)
    assert [key for key, _ in plan.waiting] == ["a", "b"]
    assert plan.fill == [11]


def test_the_transaction_next_in_line_is_replaced_when_overdue() -> None:
    in_flight = {"head": _sent(10, sent_ms=0), "behind": _sent(11, sent_ms=500)}
    assert plan_repair(10, in_flight, now_ms=999, timeout_ms=1_000).overdue == []
    overdue = plan_repair(10, in_flight, now_ms=1_000, timeout_ms=1_000).overdue
    assert [key for key, _ in overdue] == ["head"], "the one behind is not overdue yet"
    assert plan_repair(9, in_flight, now_ms=5_000, timeout_ms=1_000).overdue == [], (
        "behind a gap, no transaction of ours is late for its own sake"
    )


def test_the_overdue_run_behind_the_head_is_replaced_with_it_up_to_a_gap_or_a_fresh_one() -> None:
    in_flight = {
        "head": _sent(10),
        "second": _sent(11),
        "third": _sent(12),
        "fresh": _sent(13, sent_ms=4_500),
        "after fresh": _sent(14),
        "after gap": _sent(16),
    }
    overdue = plan_repair(10, in_flight, now_ms=5_000, timeout_ms=1_000).overdue
    assert [(key, sent.nonce) for key, sent in overdue] == [("head", 10), ("second", 11), ("third", 12)]
    later = plan_repair(10, in_flight, now_ms=6_000, timeout_ms=1_000).overdue
    assert [key for key, _ in later] == ["head", "second", "third", "fresh", "after fresh"], (
        "the run stops at the gap (nonce 15)"
    )
