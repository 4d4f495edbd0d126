"""Review tasks: the AI review of new applications and the reviewers' decisions (pure)."""

from __future__ import annotations

import uuid

import pytest

from app.lifecycle.review.settings import ReviewSettings
from app.lifecycle.review.tasks import EVENT_NS, ReviewTask, human_decided, is_duplicate, review_created
from app.platform.errors import BusinessRuleViolation
from app.platform.topics import REVIEW_TASK_FINISHED
from schemas.apply import ApplyCreated
from schemas.decision import HumanDecision
from schemas.envelope import Envelope, make_envelope
from schemas.review import ReviewTaskFinished
from tests.unit.lifecycle.applications import applied

CONFIG = ReviewSettings()


def decided(decision: str = "approve") -> Envelope[HumanDecision]:
    payload = HumanDecision(
        avcc_record_id=10042,
        decision_id="d-1",
        decision=decision,  # type: ignore[arg-type]
        final_level="G",
        reviewer="alice",
        reason="looks original",
    )
    return make_envelope(payload, source="review-svc")


def borderline() -> Envelope[ApplyCreated]:
    return applied(
        ai_tool_info={"model_name": "homebrew-gan", "model_version": "1"}, content_url="https://x.example/a"
    )


def test_fast_path_is_done_and_finishes_at_once() -> None:
    envelope = applied()
    task, outputs = review_created(None, envelope, 1000, CONFIG)
    assert (task.status, task.decision, task.final_level, task.decided_ms) == ("done", "approved", "O", 1000)
    assert task.seen == {str(envelope.event_id): 1000}
    [out] = outputs
    assert out.topic == REVIEW_TASK_FINISHED and out.avcc_record_id == 10042
    finished = out.envelope.payload
    assert isinstance(finished, ReviewTaskFinished) and finished.decision == "approved"
    assert out.envelope.event_id == uuid.uuid5(EVENT_NS, f"review.finished:{envelope.event_id}")


def test_borderline_waits_for_a_human_then_the_decision_finishes_it() -> None:
    task, outputs = review_created(None, borderline(), 1000, CONFIG)
    assert (task.status, task.decision, task.decided_ms) == ("need_human", None, None)
    assert outputs[0].envelope.payload.decision == "need_human"  # type: ignore[attr-defined]
    decision = decided("reject")
    done, [out] = human_decided(task, decision, 2000)
    assert (done.status, done.decision, done.final_level, done.reviewer) == ("done", "rejected", "G", "alice")
    assert str(decision.event_id) in done.seen and done.decided_ms == 2000
    assert out.envelope.payload.decision == "rejected"  # type: ignore[attr-defined]
    assert task.status == "need_human"  # pure: the input is unchanged


def test_a_task_keeps_what_the_reviewer_decides_from() -> None:
    """The workbench shows the work, the tool and when it was submitted, from the task alone."""
    envelope = borderline()
    task, _ = review_created(None, envelope, 1000, CONFIG)
    application = envelope.payload
    assert (task.title, task.content_url, task.content_hash) == (
        application.title,
        "https://x.example/a",
        application.content_hash,
    )
    assert task.ai_tool_info == {"model_name": "homebrew-gan", "model_version": "1"}
    assert task.submitted_ms == envelope.timestamp
    old = ReviewTask.model_validate_json(
        task.model_dump_json(exclude={"title", "content_url", "ai_tool_info", "submitted_ms"})
    )
    assert old.title is None and old.submitted_ms is None  # tasks stored before still read back


def test_a_second_application_event_only_remembers_its_id() -> None:
    task, _ = review_created(None, applied(), 1000, CONFIG)
    again = applied()
    same, outputs = review_created(task, again, 2000, CONFIG)
    assert outputs == []
    assert same.model_dump(exclude={"seen"}) == task.model_dump(exclude={"seen"})
    assert is_duplicate(same, again) and not is_duplicate(task, again)


@pytest.mark.parametrize("status", [None, "done"])
def test_decision_needs_a_need_human_task(status: str | None) -> None:
    task: ReviewTask | None = None
    if status is not None:
        task, _ = review_created(None, applied(), 1000, CONFIG)
    with pytest.raises(BusinessRuleViolation):
        human_decided(task, decided(), 2000)


def test_public_view_hides_the_dedup_bookkeeping() -> None:
    task, _ = review_created(None, applied(), 1000, CONFIG)
    assert "seen" not in task.public() and task.public()["avcc_record_id"] == 10042
