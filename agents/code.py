"""code group (code-svc): wiring of HTTP applications, record lifecycle and AVCC code issuance.

Inputs, all co-partitioned on 6 partitions keyed by ``avcc_record_id``: ``apply.created`` (the
group's own output, so the record exists in its table), ``review.task.finished`` repartitioned
from 12 to 6 partitions through an internal topic, and ``chain.tx.confirmed``. Applications are
claimed per content hash by the claims agent, which serialises concurrent requests for one work
on the owner of its claims partition: one work, one record, one code. Only that owner asks its
claims agent (:mod:`app.lifecycle.code.answers`); any other worker calls it (a peer call). The
logic lives in :mod:`app.lifecycle.code`; the state in :mod:`tables.code`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import aiohttp
import faust
import orjson
from aiohttp import web
from faust.types import TP

from app.api import APPLY, APPLY_BATCH, RECORD, RECORD_COUNTS, TIME_TO_CODE
from app.lifecycle.code.answers import ClaimMoved, ClaimWaiters
from app.lifecycle.code.bulk import BulkSettings, PendingClaims, claim_batch, read_batch
from app.lifecycle.code.claims import CLAIM_TIMEOUT_S, application_answer, plan_claims
from app.lifecycle.code.recent import recent_records, render_recent_records
from app.lifecycle.code.records import (
    RecordState,
    apply_created,
    is_duplicate,
    review_finished,
    tx_confirmed,
)
from app.lifecycle.code.status_counts import ReplicaCounts, StatusCounts, merge_replicas
from app.lifecycle.code.time_to_code import (
    ReplicaTimes,
    TimeToCodeWindow,
    final_answer,
    merge_times,
    waiting_since,
)
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
from app.platform.http.auth import RequestRefused, authenticate, read_body, signed_json
from app.platform.http.openapi import route
from app.platform.http.peers import PeerClient, is_peer_call
from app.platform.http.responses import json_error, json_response
from app.platform.http.routing import (
    FORWARD_TIMEOUT_S,
    SETTLE_WAIT_S,
    answer_at_owner,
    ask_every_peer,
    partition_owner_url,
    partitions_settled,
    rebalancing_answer,
    record_request,
    table_wide_request,
    wait_settled,
)
from app.platform.http.views import install_common_views
from app.platform.kafka.partitioner import partition_for
from app.platform.kafka.producers import Outbound
from app.platform.metrics import NEED_HUMAN_OLDEST, STAGE_SECONDS
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

#: A replica's entry in a route answered over every replica (its counts, its time to code).
Replica = TypeVar("Replica")

app = get_app("code")
settings = get_settings()
bulk = BulkSettings()
bulk_claims = PendingClaims(bulk.max_in_flight, bulk.ask_timeout_s)
runtime = GroupRuntime("code", "code-svc", app)
install_common_views(app, "code")
claim_waiters = ClaimWaiters()
peers = PeerClient(settings, FORWARD_TIMEOUT_S)
#: Records by status of this worker's record partitions, kept in memory (see the module).
record_counts = StatusCounts()
#: Time to code of the records this worker gave their final answer, the last hour of it kept.
time_to_code = TimeToCodeWindow()


def oldest_need_human_s() -> float | None:
    """Since when (unix time) the oldest need_human record of this worker's partitions waits."""
    since = record_counts.oldest_waiting_ms()
    return since / 1000 if since is not None else None


NEED_HUMAN_OLDEST.source = oldest_need_human_s

#: How long the answering replica waits for each other replica's counts: below the console's
#: own time limit (``AVCC_CONSOLE_PEER_TIMEOUT_S``, 5 s), so a silent replica is named on the
#: page instead of failing the whole answer.
COUNTS_PEER_TIMEOUT_S = 3.0

review_source = source_topic(app, REVIEW_TASK_FINISHED)
record_inputs = source_topic(app, APPLY_CREATED, CODE_REVIEW_FINISHED, CHAIN_TX_CONFIRMED)
claims_topic = source_topic(app, CODE_CLAIMS)
#: Path of the peer call that asks the owner of a claims partition to claim applications.
PEER_CLAIMS = "/peer/claims/{partition}"


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


def owns_claims(partition: int) -> bool:
    """Whether this worker holds claims ``partition`` (and its claims table partition)."""
    try:
        return TP(CODE_CLAIMS.name, partition) in app.consumer.assignment()
    except Exception:  # the consumer not started yet
        return False


async def claim_here(partition: int, applications: list[ApplicationRequest]) -> list[dict[str, Any]]:
    """Claim ``applications`` (all of claims ``partition``, which this worker owns): produce one
    claim request and wait for the claims agent's replies."""
    token, replies = claim_waiters.expect(partition)
    try:
        items = [a.model_dump(mode="json", exclude_none=True) for a in applications]
        value = orjson.dumps({"token": token, "body": orjson.dumps(items).decode()})
        key = applications[0].content_hash.encode()
        await runtime.producer.send(CODE_CLAIMS, value, key, partition=partition)
        return await replies
    finally:
        claim_waiters.forget(token)


async def ask_claims(partition: int, applications: list[ApplicationRequest]) -> list[dict[str, Any]]:
    """The claims agent's replies for applications of one claims partition: asked here when this
    worker owns it, else of its owner (a peer call). ``ClaimMoved`` while ownership is unsettled
    or the owner cannot be reached (the caller answers "retry")."""
    with STAGE_SECONDS.labels("claim").time():
        return await _ask_claims(partition, applications)


async def _ask_claims(partition: int, applications: list[ApplicationRequest]) -> list[dict[str, Any]]:
    if not await wait_settled(app):
        raise ClaimMoved("partitions are being assigned; retry")
    if owns_claims(partition):
        return await claim_here(partition, applications)
    owner = partition_owner_url(app, claims.table, partition)
    if owner is None:
        raise ClaimMoved(f"claims partition {partition} has no owner yet; retry")
    body = orjson.dumps([a.model_dump(mode="json", exclude_none=True) for a in applications])
    try:
        status, answer = await peers.post(owner, PEER_CLAIMS.format(partition=partition), body)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ClaimMoved(f"owner of claims partition {partition} unreachable ({type(exc).__name__})") from exc
    if status != 200:
        raise ClaimMoved(f"owner of claims partition {partition} answered {status}")
    replies: list[dict[str, Any]] = orjson.loads(answer)["replies"]
    return replies


@app.page(PEER_CLAIMS)
class PeerClaims(faust.web.View):
    """``POST`` (peer call): claim applications of a claims partition this worker owns."""

    async def post(self, request: web.Request, partition: str) -> web.Response:
        try:
            body = await read_body(request, bulk.max_body_bytes, settings.http_body_timeout_s)
        except RequestRefused as exc:
            return exc.response()
        if not is_peer_call(request, body, settings):
            return json_error(401, "not a signed peer call", reason="peer_signature")
        if not (partition.isascii() and partition.isdigit() and int(partition) < CODE_CLAIMS.partitions):
            return json_error(
                400, "partition: not a claims partition", reason="bad_parameter", fields=["partition"]
            )
        number = int(partition)
        if not partitions_settled(app) or not owns_claims(number):
            return rebalancing_answer(f"claims partition {number} is not held here")
        try:
            applications = [ApplicationRequest.model_validate(item) for item in orjson.loads(body)]
            replies = await asyncio.wait_for(claim_here(number, applications), CLAIM_TIMEOUT_S)
        except (ClaimMoved, TimeoutError):
            return rebalancing_answer(f"claims partition {number} moved")
        except (ValueError, TypeError) as exc:
            return json_error(
                400,
                f"body: not a list of applications ({type(exc).__name__})",
                reason="schema",
                fields=["body"],
            )
        return json_response({"replies": replies})


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
            replies = await asyncio.wait_for(ask_claims(partition, [application]), CLAIM_TIMEOUT_S)
        except (TimeoutError, ClaimMoved):
            return json_error(
                503,
                "claim not answered; retry with the same request_id",
                reason="claim_pending",
                retry_after_s=1,
            )
        status, answer = application_answer(application.request_id, replies[0])
        return json_response(answer, status)


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
    record_counts.invalidate()


app.on_partitions_revoked.connect(record_partitions_moved)  # type: ignore[arg-type]  # mode's signal typing
app.on_partitions_assigned.connect(record_partitions_moved)  # type: ignore[arg-type]


def held_record_partitions() -> list[int]:
    """The record partitions this worker holds (its active partitions of the records changelog)."""
    changelog = records.changelog
    return sorted(tp.partition for tp in app.assignor.assigned_actives() if tp.topic == changelog)


async def counts_built() -> bool:
    """Rebuild the record counts if a rebalance left them unbuilt and the table partitions are
    recovered; whether they are built."""
    if record_counts.ready:
        return True
    if not partitions_settled(app):
        return False
    return await record_counts.rebuild(held_record_partitions(), records.table.items)


async def keep_record_counts() -> None:
    """Rebuild the counts soon after each assignment, before anyone asks."""
    await counts_built()


app.timer(interval=1.0)(keep_record_counts)


async def counts_here() -> ReplicaCounts | None:
    """This worker's counts (waiting at most :data:`SETTLE_WAIT_S` for a rebuild)."""
    deadline = asyncio.get_running_loop().time() + SETTLE_WAIT_S
    while not await counts_built():
        if asyncio.get_running_loop().time() >= deadline:
            return None
        await asyncio.sleep(0.1)
    snapshot = record_counts.snapshot()
    if snapshot is None:
        return None
    partitions, counts = snapshot
    return ReplicaCounts(str(app.conf.canonical_url).rstrip("/"), partitions, counts)


async def for_every_replica(
    request: web.Request,
    mine: Callable[[ReplicaCounts], Replica],
    entry: Callable[[Mapping[str, Any]], Replica],
    silent: Callable[[str, tuple[int, ...], str], Replica],
    merge: Callable[[list[Replica], int], dict[str, Any]],
) -> web.Response:
    """A summary of every record partition, answered the same by any replica: ``mine`` (this
    worker's part, from its counts) and the ``replicas`` entries every other replica holding
    record partitions answers to the request forwarded (``entry`` reads one;
    ``silent(url, partitions, why)`` stands for one that does not answer), ``merge``d."""
    forwarded = await table_wide_request(app, request, settings, scope="records:read")
    if isinstance(forwarded, web.Response):
        return forwarded
    here = await counts_here()
    if here is None:
        return rebalancing_answer("record counts are being rebuilt after a rebalance")
    replicas = [mine(here)]
    if not forwarded:
        for peer in await ask_every_peer(
            app, records.table, request, settings, timeout_s=COUNTS_PEER_TIMEOUT_S
        ):
            if peer.answer.status == 200 and isinstance(peer.answer.body, bytes):
                replicas.extend(entry(e) for e in orjson.loads(peer.answer.body)["replicas"])
                continue
            try:
                reason = orjson.loads(peer.answer.body or b"{}").get("error", "")  # type: ignore[arg-type]
            except (orjson.JSONDecodeError, TypeError, AttributeError):
                reason = ""
            error = f"answered {peer.answer.status}" + (f": {reason}" if reason else "")
            replicas.append(silent(peer.url, peer.partitions, error))
    return json_response(merge(replicas, APPLY_CREATED.partitions))


def silent_counts(url: str, partitions: tuple[int, ...], error: str) -> ReplicaCounts:
    """A replica that did not answer its counts."""
    return ReplicaCounts(url, partitions, error=error)


@route(app, RECORD_COUNTS)
class RecordCounts(faust.web.View):
    """``GET``: records by status of every record partition: this replica's counts plus those of
    every other replica holding record partitions; one that does not answer is named with the
    partitions it held."""

    async def get(self, request: web.Request) -> web.Response:
        return await for_every_replica(
            request, lambda counts: counts, ReplicaCounts.from_json, silent_counts, merge_replicas
        )


def times_of(counts: ReplicaCounts) -> ReplicaTimes:
    """This worker's time to code of the last hour and its oldest need_human wait."""
    return ReplicaTimes(
        counts.url, counts.partitions, time_to_code.snapshot(), record_counts.oldest_waiting_ms()
    )


def silent_times(url: str, partitions: tuple[int, ...], error: str) -> ReplicaTimes:
    """A replica that did not answer its time to code."""
    return ReplicaTimes(url, partitions, error=error)


@route(app, TIME_TO_CODE)
class TimeToCode(faust.web.View):
    """``GET``: time to code of the last hour and the oldest need_human wait, over every replica
    holding record partitions, like the record counts."""

    async def get(self, request: web.Request) -> web.Response:
        return await for_every_replica(request, times_of, ReplicaTimes.from_json, silent_times, merge_times)
