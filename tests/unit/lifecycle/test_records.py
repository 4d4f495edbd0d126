"""Record lifecycle: dedup by event id, and one code whatever order the record's events arrive in."""

from __future__ import annotations

import itertools
from typing import Any

from app.lifecycle.code.records import (
    HISTORY_LIMIT,
    SEEN,
    RecordState,
    apply_created,
    is_duplicate,
    review_finished,
    tx_confirmed,
)
from app.platform.topics import DAY_MS
from schemas.chain import ChainTxConfirmed
from schemas.envelope import Envelope, make_envelope
from schemas.review import ReviewTaskFinished
from tests.unit.lifecycle.applications import GOOD_HASH, applied


def test_ids_kept_as_long_as_chain_receipts_are() -> None:
    assert SEEN.retention_ms == 30 * DAY_MS
    first, second = applied(), applied()
    state = apply_created(None, first, 0, "1", "1")
    assert is_duplicate(state, first) and not is_duplicate(state, second)
    later = apply_created(state, second, 30 * DAY_MS, "1", "1")
    assert not is_duplicate(later, first) and is_duplicate(later, second)


def reviewed(decision: str = "approved") -> Envelope[ReviewTaskFinished]:
    """The review result of :func:`applied`'s record."""
    payload = ReviewTaskFinished(
        request_id="req_1",
        avcc_record_id=10042,
        review_report_id=1,
        decision=decision,
        final_level="O",
        overall_score=97.5,
        report_hash=GOOD_HASH,
    )
    return make_envelope(payload, source="review-svc")


def confirmed(status: str = "success") -> Envelope[ChainTxConfirmed]:
    """The copyright_main receipt of :func:`applied`'s record."""
    payload = ChainTxConfirmed(
        avcc_record_id=10042,
        chain_type="copyright_main",
        tx_hash="0x" + "ab" * 32,
        block_height=12,
        status=status,
        crd_address="0x" + "cd" * 20,
        idempotency_key="copyright_main:10042",
        error=None if status == "success" else "reverted",
    )
    return make_envelope(payload, source="chain-svc")


def replay(events: list[tuple[str, Envelope[Any]]]) -> list[RecordState]:
    """Every state of the record as ``events`` arrive (each transition from the previous state)."""
    steps = {"apply": apply_created, "review": review_finished, "chain": tx_confirmed}
    state: RecordState | None = None
    states = []
    for at, (kind, envelope) in enumerate(events):
        state = steps[kind](state, envelope, at, "10005", "8361")
        states.append(state)
    return states


def test_every_arrival_order_issues_one_code_with_the_review_shown() -> None:
    events = [("apply", applied()), ("review", reviewed()), ("chain", confirmed())]
    finals = []
    for order in itertools.permutations(events):
        states = replay(list(order))
        for state in states[:-1]:  # not before the last fact arrived
            assert state.avcc_code is None and state.status != "issued", state
        final = states[-1]
        assert final.status == "issued" and final.decision == "approved" and final.avcc_code
        assert sorted(h.event for h in final.history) == [
            "apply.created",
            "chain.tx.confirmed",
            "review.task.finished",
        ]
        finals.append(final.avcc_code)
    assert len(set(finals)) == 1


def test_a_chain_receipt_before_the_review_waits_for_the_approval() -> None:
    [*_, state] = replay([("apply", applied()), ("chain", confirmed())])
    assert state.avcc_code is None and state.chain_status == "success" and state.status == "submitted"
    [*_, rejected] = replay([("apply", applied()), ("chain", confirmed()), ("review", reviewed("rejected"))])
    assert rejected.avcc_code is None and rejected.status == "rejected"


def test_a_replayed_event_changes_nothing() -> None:
    apply, review, chain = applied(), reviewed(), confirmed()
    [*_, issued] = replay([("apply", apply), ("review", review), ("chain", chain)])
    assert all(is_duplicate(issued, e) for e in (apply, review, chain))


def test_a_record_keeps_its_application_and_its_latest_transitions_however_many_it_gets() -> None:
    apply = applied()
    events: list[tuple[str, Envelope[Any]]] = [("apply", apply)]
    events += [("review", reviewed("need_human")) for _ in range(HISTORY_LIMIT + 10)]
    last = confirmed("failed")
    events.append(("chain", last))
    [*_, state] = replay(events)
    assert len(state.history) == HISTORY_LIMIT
    assert state.history[0].event == "apply.created"
    assert state.history[-1].event_id == str(last.event_id)
    assert [h.at_ms for h in state.history[1:]] == list(range(len(events) - HISTORY_LIMIT + 1, len(events)))
    # what left the history is still recognised as processed
    assert all(is_duplicate(state, envelope) for _, envelope in events)


def test_a_record_s_version_grows_with_every_transition_its_history_kept_or_not() -> None:
    events: list[tuple[str, Envelope[Any]]] = [("apply", applied())]
    events += [("review", reviewed("need_human")) for _ in range(HISTORY_LIMIT + 4)]
    states = replay(events)
    assert [s.transitions for s in states] == list(range(1, len(events) + 1))
    stored_before_the_count = states[1].model_dump(exclude={"transitions"})
    assert RecordState.model_validate(stored_before_the_count).transitions == 2
