"""review group (review-svc): wiring of the rule-based AI review, human review, ``review.task.finished``.

Consumes ``apply.created`` and human decisions (an internal topic co-partitioned with it), keeps
one task per record in the ``tasks`` table, and produces the final ``review.task.finished``.
O-level works pass the automatic fast path (seed: O 类作品秒级赋码); borderline scores wait as
``need_human`` until ``POST /v1/review/tasks/{id}/decision``. The logic lives in
:mod:`app.lifecycle.review`; the state in :mod:`tables.review`.
"""

from __future__ import annotations

import uuid
from typing import Any

import faust
import orjson
from aiohttp import web

from app.api import DECIDE, TASKS
from app.lifecycle.review.listing import TaskPage, TaskQuery, merge_pages
from app.lifecycle.review.settings import get_review_settings
from app.lifecycle.review.tasks import human_decided, is_duplicate, review_created
from app.platform.faust.app import get_app
from app.platform.faust.runtime import Effects, GroupRuntime, now_ms, source_topic
from app.platform.http.openapi import route
from app.platform.http.responses import BadRequest, json_error, json_response, parse_body
from app.platform.http.routing import OwnerRouting
from app.platform.http.views import install_common_views
from app.platform.settings import get_settings
from app.platform.topics import APPLY_CREATED, REVIEW_DECISIONS
from schemas.apply import ApplyCreated
from schemas.decision import HumanDecision, HumanDecisionRequest
from schemas.envelope import Envelope, encode_event, make_envelope
from tables.review import parking, tasks

__all__ = ["app"]

app = get_app("review")
settings = get_settings()
runtime = GroupRuntime("review", "review-svc", app)
install_common_views(app, "review")
review_config = get_review_settings()
#: Who holds which partition of the tasks table, and the calls to them.
routing = OwnerRouting(app, tasks.table, settings)

inputs = source_topic(app, APPLY_CREATED, REVIEW_DECISIONS)


async def handle_review_input(envelope: Envelope[Any]) -> Effects:
    """Dedup, then the pure review step; the task is written once the outputs are acked."""
    payload = envelope.payload
    key = str(payload.avcc_record_id)
    task = tasks.get(key)
    if is_duplicate(task, envelope):
        return Effects(duplicate=True)
    now = now_ms()
    if isinstance(payload, ApplyCreated):
        new, outputs = review_created(task, envelope, now, review_config)
    else:
        new, outputs = human_decided(task, envelope, now)
    return Effects(outputs=outputs, writes=[tasks.write(key, new)])


@app.agent(inputs)
async def review_tasks(stream: Any) -> None:
    """AI review of applications and human decisions, per record in order."""

    await runtime.consume(stream, handle_review_input, parking=parking)


@route(app, TASKS)
class Tasks(faust.web.View):
    """``GET ?status=need_human&applicant_id=&final_level=&created_before_ms=&after=&limit=``: the
    review tasks of every replica, filtered, oldest first, a page at a time."""

    async def get(self, request: web.Request) -> web.Response:
        """Answered the same by every replica: the page of this worker's partitions merged with
        those of its peers (asked with the request forwarded, so with the same query)."""
        forwarded = await routing.table_wide_request(request, scope="review:decide")
        if isinstance(forwarded, web.Response):
            return forwarded
        try:
            query = TaskQuery.parse(request.query)
        except ValueError as exc:
            return json_error(400, str(exc), reason="bad_parameter", fields=[str(exc).split(":", 1)[0]])
        pages = [query.page(t.public() for t in tasks.values())]
        if not forwarded:
            peers = await routing.fan_out(request, "all")
            if peers.refusal is not None:
                return peers.refusal
            pages.extend(TaskPage.from_json(orjson.loads(peer.body)) for peer in peers.answers)
        return json_response(merge_pages(query, pages).as_json())


@route(app, DECIDE)
class Decision(faust.web.View):
    """``POST``: a reviewer approves or rejects a ``need_human`` task."""

    async def post(self, request: web.Request, avcc_record_id: str) -> web.Response:
        signed = await routing.record_request(request, avcc_record_id, scope="review:decide")
        if isinstance(signed, web.Response):
            return signed
        try:
            req = parse_body(HumanDecisionRequest, signed.body)
        except BadRequest as exc:
            return exc.response()
        record_id, key = signed.record_id, signed.key
        routed = await routing.answer_at_owner(signed, request)
        if routed is not None:
            return routed
        task = tasks.get(str(record_id))
        if task is None:
            return json_error(404, f"no review task for record {record_id}", reason="not_found")
        if task.status != "need_human":
            return json_error(409, f"task is {task.status}, not need_human", reason="not_need_human")
        decision = HumanDecision(
            avcc_record_id=record_id,
            decision_id=str(uuid.uuid4()),
            decided_by_key=signed.signed.key_id,
            **req.model_dump(),
        )
        envelope = make_envelope(decision, source="review-svc")
        await runtime.producer.send(REVIEW_DECISIONS, encode_event(envelope), key)
        answer = {"avcc_record_id": record_id, "status": "accepted", "event_id": str(envelope.event_id)}
        return json_response(answer, 202)
