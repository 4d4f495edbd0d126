"""code group (code-svc): wiring of HTTP applications, record lifecycle and AVCC code issuance.

Inputs, all co-partitioned on 6 partitions keyed by ``avcc_record_id``: ``apply.created`` (the
group's own output, so the record exists in its table), ``review.task.finished`` repartitioned
from 12 to 6 partitions through an internal topic, and ``chain.tx.confirmed``. Applications are
claimed per content hash by the claims agent, which serialises concurrent requests for one work
on the owner of its claims partition: one work, one record, one code (where a claim is asked:
:mod:`app.lifecycle.code.claim_routing`). The logic lives in :mod:`app.lifecycle.code`, the
summaries over every replica in :mod:`app.lifecycle.code.replica_summaries`; the state in
:mod:`tables.code`.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import faust
import orjson
from aiohttp import web
from faust.types import TP

from app.api import APPLY, APPLY_BATCH, RECORD, RECORD_COUNTS, TIME_TO_CODE
from app.lifecycle.code.answers import ClaimMoved, ClaimWaiters
from app.lifecycle.code.bulk import PendingClaims, claim_batch, read_batch
from app.lifecycle.code.claim_routing import PEER_CLAIMS, ClaimRouting, claims_partition
from app.lifecycle.code.claims import CLAIM_TIMEOUT_S, application_answer, plan_claims
from app.lifecycle.code.recent import recent_records, render_recent_records
from app.lifecycle.code.records import (
    RecordState,
    apply_created,
    is_duplicate,
    review_finished,
    tx_confirmed,
)
from app.lifecycle.code.replica_summaries import ReplicaSummaries
from app.lifecycle.code.settings import get_bulk_settings
from app.lifecycle.code.status_counts import StatusCounts
from app.lifecycle.code.time_to_code import TimeToCodeWindow, final_answer, waiting_since
from app.platform.faust.app import get_app
from app.platform.faust.runtime import (
    HEADER_TARGET_GROUP,
    Batch,
    Effects,
    GroupRuntime,
    header_value,
    now_ms,
    source_topic,
)
from app.platform.http.auth import authenticate, signed_json
from app.platform.http.openapi import route
from app.platform.http.responses import RequestRefused, json_error, json_response
from app.platform.http.routing import OwnerRouting, rebalancing_answer
from app.platform.http.views import install_common_views
from app.platform.kafka.producers import Outbound
from app.platform.metrics import NEED_HUMAN_OLDEST
from app.platform.settings import get_settings
from app.platform.topics import (
    APPLY_CREATED,
    CHAIN_TX_CONFIRMED,
    CODE_CLAIMS,
    CODE_REVIEW_FINISHED,
    REVIEW_TASK_FINISHED,
)
from schemas.application import ApplicationRequest
from schemas.apply import ApplyCreated
from schemas.chain import ChainTxConfirmed
from schemas.envelope import Envelope
from schemas.review import ReviewTaskFinished
from tables.code import claims, record_parking, records

__all__ = ["app"]

app = get_app("code")
settings = get_settings()
bulk = get_bulk_settings()
bulk_claims = PendingClaims(bulk.max_in_flight, bulk.ask_timeout_s)
runtime = GroupRuntime("code", "code-svc", app)
install_common_views(app, "code")
claim_waiters = ClaimWaiters()
#: Where an application is claimed: here, or on the owner of its claims partition.
claiming = ClaimRouting(
    runtime, OwnerRouting(app, claims.table, settings), claim_waiters, bulk.max_body_bytes
)
#: Records by status of this worker's record partitions, kept in memory (see the module).
record_counts = StatusCounts()
#: Time to code of the records this worker gave their final answer, the last hour of it kept.
time_to_code = TimeToCodeWindow()
#: Who holds which record partition, and the calls to them.
records_routing = OwnerRouting(app, records.table, settings)
#: The record counts and the time to code over every replica.
summaries = ReplicaSummaries(records, record_counts, time_to_code, records_routing)


def oldest_need_human_s() -> float | None:
    """Since when (unix time) the oldest need_human record of this worker's partitions waits."""
    since = record_counts.oldest_waiting_ms()
    return since / 1000 if since is not None else None


NEED_HUMAN_OLDEST.source = oldest_need_human_s

review_source = source_topic(app, REVIEW_TASK_FINISHED)
record_inputs = source_topic(app, APPLY_CREATED, CODE_REVIEW_FINISHED, CHAIN_TX_CONFIRMED)
claims_topic = source_topic(app, CODE_CLAIMS)


async def relay_review_finished(event: Any, batch: Batch) -> None:
    """Relay one review.task.finished (12 partitions) to the code group's 6-partition inbox,
    key and headers kept (a retry-topic redelivery meant for another group is not relayed)."""
    message = event.message
    target = header_value(message.headers, HEADER_TARGET_GROUP)
    if target is not None and target != b"code":
        return
    headers = list(message.headers.items() if isinstance(message.headers, dict) else message.headers or [])
    batch.output(Outbound(CODE_REVIEW_FINISHED, message.value, message.key, headers))


@app.agent(review_source)
async def repartition_review_finished(stream: Any) -> None:
    """review.task.finished -> the code group's inbox, in batches."""
    await runtime.consume_batches(stream, relay_review_finished)


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
    old_status = state.status if state is not None else None
    return Effects(
        writes=[records.write(key, new)], apply=functools.partial(record_written, key, old_status, new)
    )


def record_written(key: str, old_status: str | None, new: RecordState) -> None:
    """After a durable record write: move the counts, and observe the record's time to code if
    this write gave it its final answer."""
    record_counts.moved(key, old_status, new.status, new.transitions, waiting_since(new))
    answer = final_answer(old_status, new)
    if answer is not None:
        time_to_code.observe(answer)


@app.agent(record_inputs)
async def record_lifecycle(stream: Any) -> None:
    """The record state machine over apply.created, review results and chain receipts."""
    await runtime.consume(
        stream,
        handle_record_event,
        contract_topics={CODE_REVIEW_FINISHED.name: REVIEW_TASK_FINISHED.name},
        parking=record_parking,
    )


def claim_request(raw: bytes) -> tuple[str | None, list[ApplicationRequest]]:
    """The token and applications of a claim request (``{"token", "body"}``, the body one
    application as a JSON object or several as an array; requests from before the token have
    none)."""
    request = orjson.loads(raw)
    items = orjson.loads(request["body"])
    applications = items if isinstance(items, list) else [items]
    return request.get("token"), [ApplicationRequest.model_validate(item) for item in applications]


async def process_claims(event: Any, batch: Batch) -> None:
    """Claim the applications of one claim request: their records' ``apply.created`` events and
    claims join the batch; the replies go to the waiting request once they are durable."""
    message = event.message
    try:
        token, applications = claim_request(message.value)
    except Exception as exc:  # not a claim request: dead-lettered, the partition goes on
        batch.output(runtime.dead_letter(message, CODE_CLAIMS.name, exc, attempt=1))
        return
    plan = plan_claims(applications, claims.get, message.offset, message.partition, now_ms())
    for outgoing in plan.events:
        batch.output(runtime.outbound(outgoing))
    batch.stage([claims.write(content_hash, made) for content_hash, made in plan.made.items()], event)
    if token is not None:
        replies = [answer.as_reply() for answer in plan.answers]
        batch.after.append(functools.partial(claim_waiters.answer, token, replies))


@app.agent(claims_topic)
async def claim_applications(stream: Any) -> None:
    """Claim content hashes: allocate the records and emit apply.created."""
    await runtime.consume_batches(stream, process_claims)


async def claims_moved(sender: Any, revoked: set[TP], **_: Any) -> None:
    """Requests still waiting on a revoked claims partition are answered "retry" at once."""
    claim_waiters.partitions_moved(tp.partition for tp in revoked if tp.topic == CODE_CLAIMS.name)


app.on_partitions_revoked.connect(claims_moved)  # type: ignore[arg-type]  # mode's signal typing


@app.page(PEER_CLAIMS)
class PeerClaims(faust.web.View):
    """``POST`` (peer call): claim applications of a claims partition this worker owns."""

    async def post(self, request: web.Request, partition: str) -> web.Response:
        return await claiming.answer_peer(request, partition)


@route(app, APPLY)
class Applications(faust.web.View):
    """``POST``: apply for an AVCC code (HMAC-signed JSON body)."""

    async def post(self, request: web.Request) -> web.Response:
        checked = await signed_json(request, settings, ApplicationRequest, scope="apply")
        if isinstance(checked, web.Response):
            return checked
        _, application = checked
        try:
            partition = claims_partition(application)
            replies = await asyncio.wait_for(claiming.ask(partition, [application]), CLAIM_TIMEOUT_S)
        except (TimeoutError, ClaimMoved):
            return json_error(
                503,
                "claim not answered; retry with the same request_id",
                reason="claim_pending",
                retry_after_s=1,
            )
        status, answer = application_answer(application.request_id, replies[0])
        return json_response(answer, status)


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
        except RequestRefused as exc:  # the body's BatchError too
            return exc.response()
        if not bulk_claims.admits([application for _, application in valid]):
            return json_error(
                429,
                "too many applications in claims; retry later",
                reason="busy",
                retry_after_s=bulk.retry_after_s,
            )
        outcome = await claim_batch(
            valid, refused, bulk_claims, claiming.ask, claims_partition, bulk.claim_wait_s
        )
        retry = {"Retry-After": str(bulk.retry_after_s)} if outcome.status == 429 else None
        return json_response(outcome.body(), outcome.status, retry)


@route(app, RECORD)
class Record(faust.web.View):
    """``GET``: a record with its history, answered by the owner of its partition."""

    async def get(self, request: web.Request, avcc_record_id: str) -> web.Response:
        req = await records_routing.record_request(request, avcc_record_id, scope="records:read")
        if isinstance(req, web.Response):
            return req
        routed = await records_routing.answer_at_owner(req, request)
        if routed is not None:
            return routed
        state = records.get(str(req.record_id))
        if state is None:
            return json_error(404, f"record {avcc_record_id} not found", reason="not_found")
        return json_response(state.public())


@app.page("/records")
class RecentRecordsPage(faust.web.View):
    """Operator page (login by the worker's middleware): the records held by this worker, most
    recently updated first, from a bounded scan that yields to the event loop."""

    async def get(self, request: web.Request) -> web.Response:
        try:
            recent = await recent_records(records.table.values())
        except RuntimeError:  # the table's partitions changed under the scan (a rebalance)
            return rebalancing_answer("the table's partitions changed under the page")
        return web.Response(text=render_recent_records(recent), content_type="text/html")


async def record_partitions_moved(sender: Any, tps: set[TP], **_: Any) -> None:
    """A rebalance: the counts wait for the next rebuild."""
    summaries.partitions_moved()


app.on_partitions_revoked.connect(record_partitions_moved)  # type: ignore[arg-type]  # mode's signal typing
app.on_partitions_assigned.connect(record_partitions_moved)  # type: ignore[arg-type]
app.timer(interval=1.0)(summaries.keep_counts)


@route(app, RECORD_COUNTS)
class RecordCounts(faust.web.View):
    """``GET``: records by status of every record partition: this replica's counts plus those of
    every other replica holding record partitions; one that does not answer is named with the
    partitions it held."""

    async def get(self, request: web.Request) -> web.Response:
        return await summaries.record_counts(request)


@route(app, TIME_TO_CODE)
class TimeToCode(faust.web.View):
    """``GET``: time to code of the last hour and the oldest need_human wait, over every replica
    holding record partitions, like the record counts."""

    async def get(self, request: web.Request) -> web.Response:
        return await summaries.time_to_code(request)
