"""Time to code: observed once per record, when it gets its final answer, with its stages; the
last hour kept in minute slots and added up over replicas."""

from __future__ import annotations

from typing import Any

import pytest

from app.lifecycle.code.records import HistoryEntry, RecordState, apply_created, review_finished, tx_confirmed
from app.lifecycle.code.time_to_code import (
    FinalAnswer,
    ReplicaTimes,
    TimeToCodeWindow,
    Window,
    final_answer,
    merge_times,
    stage_seconds,
    waiting_since,
)
from app.platform.metrics import REGISTRY, TIME_TO_CODE_BUCKETS
from schemas.envelope import Envelope
from tests.unit.lifecycle.applications import applied
from tests.unit.lifecycle.test_records import confirmed, reviewed

#: The application's acceptance (its apply.created event's time), epoch ms.
T0 = 1_780_000_000_000
STEPS = {"apply": apply_created, "review": review_finished, "chain": tx_confirmed}


def live(events: list[tuple[str, int, Envelope[Any]]]) -> list[tuple[str | None, RecordState]]:
    """``(status before, record after)`` of each write, the events applied at ``T0 + ms``."""
    state: RecordState | None = None
    writes = []
    for kind, ms, envelope in events:
        before = state.status if state is not None else None
        state = STEPS[kind](state, envelope, T0 + ms, "10005", "8361")
        writes.append((before, state))
    return writes


def accepted() -> Envelope[Any]:
    return applied().model_copy(update={"timestamp": T0})


def answers(writes: list[tuple[str | None, RecordState]]) -> list[FinalAnswer | None]:
    return [final_answer(before, after) for before, after in writes]


def test_the_write_that_issues_the_code_observes_the_record_once_with_stages_that_add_up() -> None:
    writes = live(
        [
            ("apply", 120, accepted()),
            ("review", 400, reviewed()),
            ("chain", 3400, confirmed()),
            ("chain", 5000, confirmed()),  # a second receipt: ignored, the record stays issued
            ("review", 6000, reviewed("rejected")),  # a late review result: ignored
        ]
    )
    observed = answers(writes)
    assert observed[:2] == [None, None] and observed[3:] == [None, None]
    answer = observed[2]
    assert answer is not None
    assert (answer.level, answer.outcome, answer.review, answer.seconds) == ("O", "issued", "ai", 3.4)
    assert answer.stages == {"code": 0.12, "review": 0.28, "chain": 3.0}
    assert sum(answer.stages.values()) == pytest.approx(answer.seconds)


def test_a_receipt_before_the_review_result_leaves_the_chain_nothing_to_wait_for() -> None:
    writes = live([("apply", 50, accepted()), ("chain", 300, confirmed()), ("review", 900, reviewed())])
    answer = answers(writes)[-1]
    assert answer is not None and answer.seconds == 0.9
    assert answer.stages == {"code": 0.05, "review": 0.85, "chain": 0.0}


def test_a_person_deciding_is_the_human_wait_and_marks_the_answer_human() -> None:
    writes = live(
        [
            ("apply", 100, accepted()),
            ("review", 300, reviewed("need_human")),
            ("review", 600_300, reviewed()),
            ("chain", 600_500, confirmed()),
        ]
    )
    assert waiting_since(writes[1][1]) == T0 + 300
    assert waiting_since(writes[2][1]) is None
    answer = answers(writes)[-1]
    assert answer is not None and (answer.review, answer.seconds) == ("human", 600.5)
    assert answer.stages == {"code": 0.1, "review": 0.2, "human_wait": 600.0, "chain": 0.2}


def test_a_refusal_and_a_chain_failure_are_final_answers_too() -> None:
    refused = answers(live([("apply", 100, accepted()), ("review", 700, reviewed("rejected"))]))[-1]
    assert refused is not None and (refused.outcome, refused.seconds) == ("rejected", 0.7)
    assert "chain" not in refused.stages
    failed = live([("apply", 100, accepted()), ("chain", 800, confirmed("failed"))])
    answer = answers(failed)[-1]
    assert answer is not None and (answer.level, answer.outcome) == ("unknown", "chain_failed")
    # the review result arriving after the failure does not answer the record a second time
    later = review_finished(failed[-1][1], reviewed(), T0 + 900, "10005", "8361")
    assert later.status == "chain_failed" and final_answer(failed[-1][1].status, later) is None


def test_a_capped_history_still_gives_the_total_and_drops_only_the_stages_it_lost() -> None:
    writes = live([("apply", 100, accepted()), ("review", 400, reviewed()), ("chain", 2400, confirmed())])
    before, issued = writes[-1]
    first, *_, last = issued.history
    capped = issued.model_copy(update={"history": (first, last)})  # the review entry dropped
    answer = final_answer(before, capped)
    assert answer is not None and answer.seconds == 2.4 and answer.outcome == "issued"
    assert answer.stages == {"code": 0.1}
    assert stage_seconds(capped.model_copy(update={"history": ()})) == {}


def test_a_need_human_run_waits_since_its_first_entry() -> None:
    def entry(at: int, status: str) -> HistoryEntry:
        return HistoryEntry(at_ms=at, status=status, event="review.task.finished", event_id=str(at))

    record = RecordState(
        avcc_record_id=1,
        status="need_human",
        updated_ms=90,
        history=(entry(10, "submitted"), entry(20, "need_human"), entry(90, "need_human")),
    )
    assert waiting_since(record) == 20
    assert waiting_since(record.model_copy(update={"history": ()})) == 90


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_window_keeps_the_last_hour_and_feeds_the_histograms() -> None:
    clock = [1_000_000.0]
    window = TimeToCodeWindow(clock=lambda: clock[0])
    labels = {"level": "G", "outcome": "issued", "review": "ai"}
    before = _sample("avcc_time_to_code_seconds_bucket", **labels, le="5.0")
    chain_before = _sample("avcc_time_to_code_stage_seconds_count", level="G", stage="chain")
    window.observe(FinalAnswer("G", "issued", "ai", 4.0, {"chain": 3.0}))
    clock[0] += 1800
    window.observe(FinalAnswer("G", "issued", "ai", 5.0, {"chain": 4.0}))  # a bound is "within"
    window.observe(FinalAnswer("G", "issued", "ai", 400.0, {}))  # past the last bound: +Inf only
    assert _sample("avcc_time_to_code_seconds_bucket", **labels, le="5.0") - before == 2
    assert _sample("avcc_time_to_code_stage_seconds_count", level="G", stage="chain") - chain_before == 2
    counts, total = window.snapshot().series[("G", "issued", "ai")]
    assert sum(counts) == 3 and counts[-1] == 1 and total == 409.0
    assert counts[TIME_TO_CODE_BUCKETS.index(5.0)] == 1 and counts[TIME_TO_CODE_BUCKETS.index(4.0)] == 1
    clock[0] += 1800  # the first answer's minute is now more than an hour ago
    series = window.snapshot()
    assert sum(series.series[("G", "issued", "ai")][0]) == 2
    assert series.stages[("G", "chain")] == (1, 4.0)


def test_replicas_add_up_their_windows_and_the_oldest_wait_is_the_earliest() -> None:
    mine, theirs = Window(), Window()
    mine.add(FinalAnswer("O", "issued", "ai", 0.35, {"code": 0.05}))
    theirs.add(FinalAnswer("O", "issued", "ai", 0.45, {"code": 0.15}))
    theirs.add(FinalAnswer("P", "rejected", "ai", 2.0, {}))
    here = ReplicaTimes("http://127.0.0.1:6067", (0, 2, 4), mine, None)
    peer = ReplicaTimes.from_json(
        merge_times([ReplicaTimes("http://127.0.0.2:6067", (1, 3), theirs, T0)], 6)["replicas"][0]
    )
    silent = ReplicaTimes("http://127.0.0.3:6067", (5,), error="answered 503")
    body = merge_times([peer, here, silent], 6)
    assert body["bounds"] == list(TIME_TO_CODE_BUCKETS) and body["window_s"] == 3600
    o_level = next(s for s in body["series"] if s["level"] == "O")
    assert o_level["buckets"][-1] == 2 and o_level["sum"] == 0.8
    assert o_level["buckets"][TIME_TO_CODE_BUCKETS.index(0.4)] == 1
    assert body["stages"] == [{"level": "O", "stage": "code", "count": 2, "sum": 0.2}]
    assert body["oldest_need_human_ms"] == T0
    assert body["missing_partitions"] == [5]
    assert [r["answered"] for r in body["replicas"]] == [True, True, False]
    assert Window.from_json(body).series == Window.from_json(merge_times([here, peer], 6)).series
