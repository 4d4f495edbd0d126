"""Review tasks: one per record, from the AI review of its application to the final decision.

Pure transitions over a record's :class:`ReviewTask`: :func:`review_created` runs the rule-based
review of a new application (O-level works pass the automatic fast path; borderline scores wait
as ``need_human``), :func:`human_decided` applies a reviewer's decision. Each returns the new task
and the ``review.task.finished`` to produce, with a name-based event id so a replay produces
the same event.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from app.lifecycle.review.rules import review_application
from app.lifecycle.review.settings import ReviewSettings
from app.platform.errors import BusinessRuleViolation
from app.platform.faust.dedup import SeenEvents
from app.platform.faust.effects import Outgoing
from app.platform.topics import APPLY_CREATED, REVIEW_DECISIONS, REVIEW_TASK_FINISHED
from schemas.apply import ApplyCreated
from schemas.decision import HumanDecision
from schemas.envelope import Envelope, make_envelope
from schemas.review import ReviewTaskFinished

__all__ = ["EVENT_NS", "SEEN", "ReviewTask", "human_decided", "is_duplicate", "review_created"]

EVENT_NS: Final = uuid.UUID("0b7f5a52-3a1e-4d53-8f0e-5c7d2b9e6a11")
#: Processed event ids of a task, kept as long as its input topics keep the events.
SEEN = SeenEvents.for_inputs(APPLY_CREATED, REVIEW_DECISIONS)


class ReviewTask(BaseModel):
    """One record's review: the AI outcome, the report, the final decision."""

    model_config = ConfigDict(frozen=True)

    avcc_record_id: int
    request_id: str
    status: str
    overall_score: float
    final_level: str
    ai_decision: str
    decision: str | None = None
    review_report_id: int
    report: dict[str, Any]
    report_hash: str
    content_hash: str | None = None
    applicant_id: str | None = None
    #: What the reviewer looks at, from the application (``None`` on tasks made before they were kept).
    title: str | None = None
    content_url: str | None = None
    ai_tool_info: dict[str, str] | None = None
    #: When the application was accepted (its ``apply.created`` event), epoch ms.
    submitted_ms: int | None = None
    reviewer: str | None = None
    decided_by_key: str | None = None
    reason: str | None = None
    created_ms: int
    decided_ms: int | None = None
    seen: dict[str, int] = Field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """The task as the HTTP API shows it (without the dedup bookkeeping)."""
        return self.model_dump(exclude={"seen"})


def is_duplicate(task: ReviewTask | None, envelope: Envelope[Any]) -> bool:
    """Whether this event id was already applied to the task."""
    return task is not None and SEEN.contains(task.seen, str(envelope.event_id))


def _seen(task: ReviewTask | None, event_id: str, now: int) -> dict[str, int]:
    return SEEN.remember(task.seen if task else {}, event_id, now)


def _finished(task: ReviewTask, decision: str, level: str, cause: str) -> Outgoing:
    payload = ReviewTaskFinished(
        request_id=task.request_id,
        avcc_record_id=task.avcc_record_id,
        review_report_id=task.review_report_id,
        decision=decision,  # type: ignore[arg-type]
        final_level=level,  # type: ignore[arg-type]
        overall_score=task.overall_score,
        report_hash=task.report_hash,
        content_hash=task.content_hash,
        applicant_id=task.applicant_id,
    )
    envelope = make_envelope(
        payload, source="review-svc", event_id=uuid.uuid5(EVENT_NS, f"review.finished:{cause}")
    )
    return Outgoing(REVIEW_TASK_FINISHED, envelope, task.avcc_record_id)


def review_created(
    task: ReviewTask | None, envelope: Envelope[ApplyCreated], now: int, config: ReviewSettings
) -> tuple[ReviewTask, list[Outgoing]]:
    """Run the AI review of a new application; an existing task only remembers the event."""
    p = envelope.payload
    if task is not None:
        return task.model_copy(update={"seen": _seen(task, str(envelope.event_id), now)}), []
    outcome = review_application(p, config)
    new = ReviewTask(
        avcc_record_id=p.avcc_record_id,
        request_id=p.request_id,
        status="need_human" if outcome.decision == "need_human" else "done",
        overall_score=outcome.overall_score,
        final_level=outcome.final_level,
        ai_decision=outcome.decision,
        decision=None if outcome.decision == "need_human" else outcome.decision,
        review_report_id=p.avcc_record_id,
        report=outcome.report,
        report_hash=outcome.report_hash,
        content_hash=p.content_hash,
        applicant_id=p.applicant_id,
        title=p.title,
        content_url=p.content_url,
        ai_tool_info=p.ai_tool_info.model_dump(),
        submitted_ms=envelope.timestamp,
        created_ms=now,
        decided_ms=None if outcome.decision == "need_human" else now,
        seen=_seen(None, str(envelope.event_id), now),
    )
    outputs = [_finished(new, outcome.decision, outcome.final_level, str(envelope.event_id))]
    return new, outputs


def human_decided(
    task: ReviewTask | None, envelope: Envelope[HumanDecision], now: int
) -> tuple[ReviewTask, list[Outgoing]]:
    """Apply a reviewer's decision to a ``need_human`` task (``BusinessRuleViolation`` otherwise)."""
    d = envelope.payload
    if task is None or task.status != "need_human":
        state = "missing" if task is None else task.status
        raise BusinessRuleViolation(f"task {d.avcc_record_id} is {state}, not need_human")
    decision = "approved" if d.decision == "approve" else "rejected"
    new = task.model_copy(
        update={
            "status": "done",
            "decision": decision,
            "final_level": d.final_level,
            "reviewer": d.reviewer,
            "decided_by_key": d.decided_by_key,
            "reason": d.reason,
            "decided_ms": now,
            "seen": _seen(task, str(envelope.event_id), now),
        }
    )
    return new, [_finished(new, decision, d.final_level, str(envelope.event_id))]
