"""code group (code-svc): wiring of HTTP applications, record lifecycle and AVCC code issuance.

Inputs, all co-partitioned on 6 partitions keyed by ``avcc_record_id``: ``apply.created`` (the
group's own output, so the record exists in its table), ``review.task.finished`` repartitioned
from 12 to 6 partitions through an internal topic, and ``chain.tx.confirmed``. Applications are
claimed per content hash by the claims agent (faust ask/reply), which serialises concurrent
requests for one work on one partition owner: one work, one record, one code. The logic lives in
:mod:`app.lifecycle.code`; the state in :mod:`tables.code`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import orjson
from aiohttp import web

from app.api import APPLY, APPLY_BATCH, RECORD, RECORD_COUNTS
from app.lifecycle.code.bulk import BulkSettings, PendingClaims, claim_batch, read_batch
from app.lifecycle.code.claims import (
    CLAIM_TIMEOUT_S,
    ClaimAnswer,
    application_answer,
    plan_claims,
)
from app.lifecycle.code.recent import recent_records, render_recent_records, status_counts
from app.lifecycle.code.records import apply_created, is_duplicate, review_finished, tx_confirmed
from app.platform.faust.app import get_app
from app.platform.faust.runtime import (
    HEADER_TARGET_GROUP,
    Effects,
    GroupRuntime,
    consume_each,
    header_value,
    now_ms,
)
from app.platform.http.auth import RequestRefused, authenticate, require_hmac, signed_json
from app.platform.http.openapi import route
from app.platform.http.responses import json_error, json_response
from app.platform.http.routing import answer_at_owner, record_request
from app.platform.http.views import install_common_views
from app.platform.kafka.partitioner import partition_for
from app.platform.settings import get_settings
from app.platform.topics import (
    APPLY_CREATED,
    CHAIN_TX_CONFIRMED,
    CODE_CLAIMS,
    CODE_REVIEW_FINISHED,
    REVIEW_TASK_FINISHED,
    TopicSpec,
)
from app.playback.gateway.ingest import BatchError
from schemas.application import ApplicationRequest
from schemas.apply import ApplyCreated
from schemas.chain import ChainTxConfirmed
from schemas.envelope import Envelope
from schemas.review import ReviewTaskFinished
from tables.code import claims, record_parking, records

__all__ = ["app"]

app = get_app("code")
settings = get_settings()
bulk = BulkSettings()
bulk_claims = PendingClaims(bulk.max_in_flight, bulk.ask_timeout_s)
runtime = GroupRuntime("code", "code-svc", app)
install_common_views(app, "code")


def _raw_topic(spec: TopicSpec, *more: TopicSpec) -> Any:
    names = [spec.name, *(m.name for m in more)]
    return app.topic(
        *names,
        partitions=spec.partitions,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )


review_source = _raw_topic(REVIEW_TASK_FINISHED)
record_inputs = _raw_topic(APPLY_CREATED, CODE_REVIEW_FINISHED, CHAIN_TX_CONFIRMED)


class ClaimRequest(faust.Record, serializer="json"):
    """What to claim: one application as a JSON object (the single route), or several of one
    claims partition as a JSON array (the bulk route)."""

    body: str


claims_topic = app.topic(
    CODE_CLAIMS.name,
    partitions=CODE_CLAIMS.partitions,
    key_type=bytes,
    value_type=ClaimRequest,
    key_serializer="raw",
)


@app.agent(review_source)
async def repartition_review_finished(stream: Any) -> None:
    """Relay review.task.finished (12 partitions) to the code group's 6-partition inbox."""

    async def relay(event: Any) -> None:
        message = event.message
        target = header_value(message.headers, HEADER_TARGET_GROUP)
        if target is not None and target != b"code":
            return
        headers = list(
            message.headers.items() if isinstance(message.headers, dict) else message.headers or []
        )
        await runtime.producer.send(CODE_REVIEW_FINISHED, message.value, message.key, headers)

    await consume_each(stream, relay)


async def handle_record_event(envelope: Envelope[Any]) -> Effects:
    """Apply one lifecycle event to its record (pure transition, then a table write)."""
    payload = envelope.payload
    if isinstance(payload, ChainTxConfirmed) and payload.chain_type != "copyright_main":
        return Effects()
    key = str(payload.avcc_record_id)
    state = records.get(key)
    if is_duplicate(state, envelope):
        return Effects(duplicate=True)
    now = now_ms()
    org, node = settings.avcc_org, settings.avcc_node
    if isinstance(payload, ApplyCreated):
        new = apply_created(state, envelope, now, org, node)
    elif isinstance(payload, ReviewTaskFinished):
        new = review_finished(state, envelope, now, org, node)
    else:
        new = tx_confirmed(state, envelope, now, org, node)

    def store() -> None:
        records[key] = new

    return Effects(apply=store)


@app.agent(record_inputs)
async def record_lifecycle(stream: Any) -> None:
    """The record state machine over apply.created, review results and chain receipts."""

    async def apply(event: Any) -> None:
        topic = REVIEW_TASK_FINISHED.name if event.message.topic == CODE_REVIEW_FINISHED.name else None
        await runtime.process(event, handle_record_event, topic=topic, parking=record_parking)

    await consume_each(stream, apply)


async def claim_many(
    applications: list[ApplicationRequest], partition: int, offset: int
) -> list[ClaimAnswer]:
    """Find or make the claims of ``applications``' content hashes, the claim request at
    ``offset`` of claims ``partition``: one produce (and one wait for the acks) for all the new
    records, then the table writes."""
    plan = plan_claims(applications, claims.get, offset, partition, now_ms())
    if plan.events:
        await runtime.emit(plan.events)
        for content_hash, made in plan.made.items():
            claims[content_hash] = made
    return plan.answers


def current_message() -> Any:
    """The message the running agent is processing (its offset names the claim request)."""
    event = faust.current_event()
    if event is None:
        raise RuntimeError("claim requests are processed inside the claims agent only")
    return event.message


@app.agent(claims_topic)
async def claim_applications(stream: Any) -> Any:
    """Claim content hashes: allocate the records and emit apply.created. A request is one
    application (JSON object, the single route) or several of one partition (JSON array, the
    bulk route), answered with one reply or a list of them."""
    async for request in stream:
        message = current_message()
        if request.body.startswith("["):
            many = [ApplicationRequest.model_validate(item) for item in orjson.loads(request.body)]
            yield [answer.as_reply() for answer in await claim_many(many, message.partition, message.offset)]
        else:
            one = [ApplicationRequest.model_validate_json(request.body)]
            answers = await claim_many(one, message.partition, message.offset)
            yield answers[0].as_reply()


@route(app, APPLY)
class Applications(faust.web.View):
    """``POST``: apply for an AVCC code (HMAC-signed JSON body)."""

    async def post(self, request: web.Request) -> web.Response:
        checked = await signed_json(request, settings, ApplicationRequest, scope="apply")
        if isinstance(checked, web.Response):
            return checked
        _, application = checked
        try:
            reply = await asyncio.wait_for(ask_claim(application), CLAIM_TIMEOUT_S)
        except TimeoutError:
            return json_error(503, "claim timed out; retry with the same request_id", retry_after_s=1)
        status, answer = application_answer(application.request_id, reply)
        return json_response(answer, status)


async def ask_claim(application: ApplicationRequest) -> dict[str, Any]:
    """The claims agent's reply for one application (the single route)."""
    reply: dict[str, Any] = await claim_applications.ask(
        value=ClaimRequest(body=application.model_dump_json()),
        key=application.content_hash.encode(),
    )
    return reply


async def ask_claims(partition: int, applications: list[ApplicationRequest]) -> list[dict[str, Any]]:
    """The claims agent's replies for applications of one claims partition, in one request."""
    body = orjson.dumps([a.model_dump(mode="json", exclude_none=True) for a in applications]).decode()
    replies: list[dict[str, Any]] = await claim_applications.ask(
        value=ClaimRequest(body=body), key=applications[0].content_hash.encode(), partition=partition
    )
    return replies


def claims_partition(application: ApplicationRequest) -> int:
    """The claims partition of an application (where the single route's keyed ask lands)."""
    return partition_for(application.content_hash.encode(), CODE_CLAIMS.partitions)


@route(app, APPLY_BATCH)
class BatchApplications(faust.web.View):
    """``POST``: up to ``AVCC_BULK_MAX_ITEMS`` applications in one signed request (JSON array or
    NDJSON), each answered like the single route; 429 + Retry-After instead of a timeout."""

    async def post(self, request: web.Request) -> web.Response:
        try:
            signed = await authenticate(request, settings, scope="apply", max_body_bytes=bulk.max_body_bytes)
            # no Content-Type at all: JSON (aiohttp would report application/octet-stream)
            content_type = request.content_type if "Content-Type" in request.headers else ""
            valid, refused = read_batch(signed.body, content_type, bulk.max_items)
        except RequestRefused as exc:
            return exc.response()
        except BatchError as exc:
            return json_error(exc.status, str(exc), reason=exc.reason, **exc.details)
        if not bulk_claims.admits([application for _, application in valid]):
            return json_error(
                429,
                "too many applications in claims; retry later",
                reason="busy",
                retry_after_s=bulk.retry_after_s,
            )
        outcome = await claim_batch(
            valid, refused, bulk_claims, ask_claims, claims_partition, bulk.claim_wait_s
        )
        retry = {"Retry-After": str(bulk.retry_after_s)} if outcome.status == 429 else None
        return json_response(outcome.body(), outcome.status, retry)


@route(app, RECORD)
class Record(faust.web.View):
    """``GET``: a record with its history, answered by the owner of its partition."""

    async def get(self, request: web.Request, avcc_record_id: str) -> web.Response:
        req = await record_request(request, avcc_record_id, settings, scope="records:read")
        if isinstance(req, web.Response):
            return req
        routed = await answer_at_owner(app, records.table, req, request, settings)
        if routed is not None:
            return routed
        state = records.get(str(req.record_id))
        if state is None:
            return json_error(404, f"record {avcc_record_id} not found")
        return json_response(state.public())


@app.page("/records")
class RecentRecordsPage(faust.web.View):
    """Operator page (login by the worker's middleware): the records held by this worker, most
    recently updated first, from a bounded scan that yields to the event loop."""

    async def get(self, request: web.Request) -> web.Response:
        try:
            recent = await recent_records(records.table.values())
        except RuntimeError:  # the table's partitions changed under the scan (a rebalance)
            return web.Response(status=503, text="rebalancing; retry\n", headers={"Retry-After": "1"})
        return web.Response(text=render_recent_records(recent), content_type="text/html")


@route(app, RECORD_COUNTS)
class RecordCounts(faust.web.View):
    """``GET``: records by status among the partitions this worker holds (the console's overview;
    with several code replicas each answers for its own partitions)."""

    @require_hmac("records:read")
    async def get(self, request: web.Request) -> web.Response:
        try:
            counts, truncated = await status_counts(records.table.values())
        except RuntimeError:  # the table's partitions changed under the scan (a rebalance)
            return json_error(503, "rebalancing; retry")
        return json_response({"counts": counts, "truncated": truncated})
