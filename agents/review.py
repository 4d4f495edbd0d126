"""review group (review-svc): rule-based AI review, human review, ``review.task.finished``.

Consumes ``apply.created`` and human decisions (an internal topic co-partitioned with it), keeps
one task per record in the ``tasks`` table, and produces the final ``review.task.finished``.
O-level works pass the automatic fast path (seed: O 类作品秒级赋码); borderline scores wait as
``need_human`` until ``POST /v1/review/tasks/{id}/decision``.
"""

from __future__ import annotations

import uuid
from typing import Any

import faust
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from app.lifecycle.review.rules import ReviewConfig, review_application
from app.platform.errors import BusinessRuleViolation
from app.platform.faust.app import get_app
from app.platform.faust.runtime import Effects, GroupRuntime, Outgoing, now_ms
from app.platform.http.routing import (
    BadRequest,
    answer_at_owner,
    authorize,
    json_error,
    json_response,
    parse_body,
    record_request,
)
from app.platform.http.views import install_common_views
from app.platform.kafka.partitioner import record_key
from app.platform.settings import get_settings
from app.platform.topics import APPLY_CREATED, REVIEW_DECISIONS, REVIEW_TASK_FINISHED
from schemas.apply import ApplyCreated
from schemas.decision import HumanDecision, HumanDecisionRequest
from schemas.envelope import Envelope, encode_event, make_envelope
from schemas.review import ReviewTaskFinished
from tables.review import tasks

__all__ = ["app", "human_decided", "review_created"]

app = get_app("review")
settings = get_settings()
runtime = GroupRuntime("review", "review-svc", app)
install_common_views(app, "review")
review_config = ReviewConfig()

EVENT_NS = uuid.UUID("0b7f5a52-3a1e-4d53-8f0e-5c7d2b9e6a11")
SEEN_TTL_MS = 7 * 24 * 60 * 60 * 1000

inputs = app.topic(
    APPLY_CREATED.name,
    REVIEW_DECISIONS.name,
    partitions=APPLY_CREATED.partitions,
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
parking = runtime.parking_table("review-inputs", APPLY_CREATED.partitions)


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
    reviewer: str | None = None
    reason: str | None = None
    created_ms: int
    decided_ms: int | None = None
    seen: dict[str, int] = Field(default_factory=dict)


def _load(key: bytes) -> ReviewTask | None:
    raw = tasks.get(key)
    return ReviewTask.model_validate_json(raw) if raw else None


def _seen(task: ReviewTask | None, event_id: str, now: int) -> dict[str, int]:
    seen = {k: v for k, v in (task.seen if task else {}).items() if now - v < SEEN_TTL_MS}
    seen[event_id] = now
    return seen


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
    task: ReviewTask | None, envelope: Envelope[ApplyCreated], now: int
) -> tuple[ReviewTask, list[Outgoing]]:
    """Run the AI review of a new application (pure)."""
    p = envelope.payload
    if task is not None:
        return task.model_copy(update={"seen": _seen(task, str(envelope.event_id), now)}), []
    outcome = review_application(p, review_config)
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
        created_ms=now,
        decided_ms=None if outcome.decision == "need_human" else now,
        seen=_seen(None, str(envelope.event_id), now),
    )
    outputs = [_finished(new, outcome.decision, outcome.final_level, str(envelope.event_id))]
    return new, outputs


def human_decided(
    task: ReviewTask | None, envelope: Envelope[HumanDecision], now: int
) -> tuple[ReviewTask, list[Outgoing]]:
    """Apply a reviewer's decision to a ``need_human`` task (pure)."""
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
            "reason": d.reason,
            "decided_ms": now,
            "seen": _seen(task, str(envelope.event_id), now),
        }
    )
    return new, [_finished(new, decision, d.final_level, str(envelope.event_id))]


async def handle_review_input(envelope: Envelope[Any]) -> Effects:
    """Dedup, then the pure review step, then a table write after the outputs are acked."""
    payload = envelope.payload
    key = record_key(payload.avcc_record_id)
    task = _load(key)
    if task is not None and str(envelope.event_id) in task.seen:
        return Effects(duplicate=True)
    now = now_ms()
    if isinstance(payload, ApplyCreated):
        new, outputs = review_created(task, envelope, now)
    else:
        new, outputs = human_decided(task, envelope, now)

    def store() -> None:
        tasks[key] = new.model_dump_json().encode()

    return Effects(outputs=outputs, apply=store)


@app.agent(inputs)
async def review_tasks(stream: Any) -> None:
    """AI review of applications and human decisions, per record in order."""
    async for event in stream.events():
        await runtime.process(event, handle_review_input, parking=parking)


ROUTE_TASKS = "/v1/review/tasks"
ROUTE_DECISION = "/v1/review/tasks/{avcc_record_id}/decision"


def _task_view(task: ReviewTask) -> dict[str, Any]:
    return task.model_dump(exclude={"seen"})


@app.page(ROUTE_TASKS)
class Tasks(faust.web.View):
    """``GET ?status=need_human``: review tasks held by this worker."""

    async def get(self, request: web.Request) -> web.Response:
        denied = await authorize(request, await request.read(), settings, route=ROUTE_TASKS)
        if denied is not None:
            return denied
        wanted = request.query.get("status")
        found = [ReviewTask.model_validate_json(v) for _, v in tasks.items() if v]
        items = [_task_view(t) for t in found if wanted is None or t.status == wanted]
        items.sort(key=lambda t: t["created_ms"])
        return json_response({"tasks": items, "count": len(items)}, 200, ROUTE_TASKS, "GET")


@app.page(ROUTE_DECISION)
class Decision(faust.web.View):
    """``POST``: a reviewer approves or rejects a ``need_human`` task."""

    async def post(self, request: web.Request, avcc_record_id: str) -> web.Response:
        signed = await record_request(request, avcc_record_id, settings, route=ROUTE_DECISION)
        if isinstance(signed, web.Response):
            return signed
        try:
            req = parse_body(HumanDecisionRequest, signed.body)
        except BadRequest as exc:
            return json_error(400, str(exc), ROUTE_DECISION, "POST", fields=list(exc.fields))
        record_id, key = signed.record_id, signed.key
        routed = await answer_at_owner(
            app, tasks, key, request, signed.body, settings, forwarded=signed.forwarded, route=ROUTE_DECISION
        )
        if routed is not None:
            return routed
        task = _load(key)
        if task is None:
            return json_error(404, f"no review task for record {record_id}", ROUTE_DECISION, "POST")
        if task.status != "need_human":
            return json_error(409, f"task is {task.status}, not need_human", ROUTE_DECISION, "POST")
        decision = HumanDecision(
            avcc_record_id=record_id,
            decision_id=str(uuid.uuid4()),
            **req.model_dump(),
        )
        envelope = make_envelope(decision, source="review-svc")
        await runtime.producer.send(REVIEW_DECISIONS, encode_event(envelope), key)
        answer = {"avcc_record_id": record_id, "status": "accepted", "event_id": str(envelope.event_id)}
        return json_response(answer, 202, ROUTE_DECISION, "POST")
