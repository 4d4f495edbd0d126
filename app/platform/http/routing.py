"""Routing of requests about one table key to the worker that owns its partition.

A record's state lives on the worker owning its table partition; any worker accepts the
request, checks its signature and scope, and forwards it (marked with :func:`forward_token`, so
the owner answers instead of forwarding again) to the owner. The owner checks the request again
and claims its nonce: a request is claimed only where it is answered, so the same request sent
to two replicas meets its first claim in the shared nonce store whichever replica owns it.
:func:`record_request` and :func:`answer_at_owner` are the prologue of ``/v1/.../{avcc_record_id}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
from aiohttp import web

from app.platform.credentials import Scope
from app.platform.faust.recovery import restoring, table_recovery
from app.platform.http.auth import HEADER_SIGNATURE, RequestRefused, SignedRequest, authenticate, claim_nonce
from app.platform.http.responses import json_error
from app.platform.kafka.partitioner import partition_for, record_key
from app.platform.settings import Settings

__all__ = [
    "FORWARD_HEADER",
    "FORWARD_TIMEOUT_S",
    "SETTLE_WAIT_S",
    "PeerAnswer",
    "RecordRequest",
    "answer_at_owner",
    "answer_from_peers",
    "answers_of_every_peer",
    "ask_every_peer",
    "forward_to",
    "forward_token",
    "is_forwarded",
    "is_local",
    "owner_url",
    "ownership_settled",
    "partition_owner_url",
    "partitions_settled",
    "peer_partitions",
    "rebalancing_answer",
    "record_request",
    "table_peers",
    "table_wide_request",
    "unsettled_answer",
    "wait_settled",
]

log = logging.getLogger(__name__)

#: Set by a worker that forwards a request to the owner of a table partition.
FORWARD_HEADER = "X-AVCC-Forwarded"
#: Longest wait for a forwarded request's answer.
FORWARD_TIMEOUT_S = 15.0
#: Longest wait of a request for this worker's partitions to settle before it answers 503.
SETTLE_WAIT_S = 5.0


def forward_token(settings: Settings, signature: str) -> str:
    """Proof that a forwarded request was authenticated by a worker holding the secrets."""
    secret = "\n".join(sorted(settings.effective_hmac_keys().values())).encode()
    return hmac.new(secret, b"forward\n" + signature.encode(), hashlib.sha256).hexdigest()


def is_forwarded(request: web.Request, settings: Settings) -> bool:
    """Whether ``request`` was forwarded by a peer worker that already checked its nonce."""
    token = request.headers.get(FORWARD_HEADER)
    signature = request.headers.get(HEADER_SIGNATURE, "")
    return bool(token) and hmac.compare_digest(token or "", forward_token(settings, signature))


async def forward_to(
    base_url: str,
    request: web.Request,
    body: bytes,
    settings: Settings,
    *,
    timeout_s: float = FORWARD_TIMEOUT_S,
) -> web.Response:
    """Send ``request`` (with its body) to the worker at ``base_url`` and relay the answer
    (``Retry-After`` included); a 503 with ``Retry-After`` when that worker cannot be reached
    within ``timeout_s`` (killed, hung, restarting: the assignment still names it until the
    group rebalances)."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in {"host", "content-length"}}
    headers[FORWARD_HEADER] = forward_token(settings, request.headers.get(HEADER_SIGNATURE, ""))
    url = base_url.rstrip("/") + request.path_qs
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(request.method, url, data=body, headers=headers) as response,
        ):
            payload = await response.read()
            retry_after = response.headers.get("Retry-After")
            relayed = {"Retry-After": retry_after} if retry_after else {}
            return web.Response(
                body=payload,
                status=response.status,
                content_type=response.content_type or "application/json",
                headers=relayed,
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.info("owner %s unreachable (%s): answering 503", base_url, type(exc).__name__)
        return json_error(
            503, "partition owner unreachable (failover); retry", reason="owner_unreachable", retry_after_s=1
        )


def ownership_settled(app: Any) -> bool:
    """Whether no rebalance is in progress and faust's recovery is done: who owns each partition
    is known."""
    return not app.rebalancing and bool(app.tables.actives_ready)


def partitions_settled(app: Any) -> bool:
    """Whether ownership is settled and this worker's table partitions are restored (faust's
    recovery and the project's: :func:`restoring`): a key missing from a table then really is
    missing (not yet restored would be a wrong 404)."""
    return ownership_settled(app) and not restoring(app)


async def wait_settled(
    app: Any, wait_s: float | None = None, settled: Callable[[Any], bool] = partitions_settled
) -> bool:
    """Wait (at most ``wait_s``, default :data:`SETTLE_WAIT_S`) until ``settled(app)``; whether
    it is."""
    deadline = time.monotonic() + (SETTLE_WAIT_S if wait_s is None else wait_s)
    while not settled(app):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.1)
    return True


def rebalancing_answer(what: str = "partitions are being assigned or recovered") -> web.Response:
    """The 503 (``Retry-After: 1``) of a request that arrived while ownership is unsettled."""
    return json_error(503, f"{what} (rebalancing); retry", reason="rebalancing", retry_after_s=1)


def unsettled_answer(app: Any) -> web.Response:
    """The 503 of a request this worker cannot answer yet: ``recovering`` (how far, and a
    ``Retry-After`` from the restore's ETA, at most 10 s) while its table partitions are being
    restored, else :func:`rebalancing_answer`."""
    recovery = table_recovery(app)
    progress = [p for p in recovery.progress() if p.recovering] if recovery is not None else []
    if not progress:
        return rebalancing_answer()
    etas = [p.eta_s for p in progress if p.eta_s is not None]
    retry_after = max(1, min(10, math.ceil(max(etas)))) if etas else 1
    what = "; ".join(p.describe() for p in progress)
    return json_error(
        503,
        f"table partitions are being restored ({what}); retry",
        reason="recovering",
        retry_after_s=retry_after,
    )


def owner_url(app: Any, table: Any, key: bytes) -> str | None:
    """Base URL of the worker that owns ``key``'s partition of ``table`` (``None`` if unknown).

    The partition is murmur2 of the key like every producer computes it.
    """
    return partition_owner_url(app, table, partition_for(key, int(table.partitions)))


def partition_owner_url(app: Any, table: Any, partition: int) -> str | None:
    """Base URL of the worker that owns ``partition`` of ``table`` (``None`` if unknown), from
    faust's assignment metadata of the table's changelog topic."""
    topic = table.changelog_topic.get_topic_name()
    for url, topics in app.router.table_metadata(table.name).items():
        if partition in topics.get(topic, ()):
            return str(url).rstrip("/")
    return None


def peer_partitions(app: Any, table: Any) -> dict[str, tuple[int, ...]]:
    """Base URL -> the partitions of ``table`` it holds, for every other worker holding some
    (from faust's assignment metadata of the table's changelog topic)."""
    topic = table.changelog_topic.get_topic_name()
    held: dict[str, tuple[int, ...]] = {}
    for url, topics in app.router.table_metadata(table.name).items():
        partitions = tuple(sorted(topics.get(topic, ())))
        base = str(url).rstrip("/")
        if partitions and not is_local(app, base):
            held[base] = partitions
    return held


@dataclass(frozen=True, slots=True)
class PeerAnswer:
    """Another worker holding partitions of a table, and what it answered a forwarded request."""

    url: str
    partitions: tuple[int, ...]
    answer: web.Response


async def ask_every_peer(
    app: Any, table: Any, request: web.Request, settings: Settings, *, timeout_s: float
) -> list[PeerAnswer]:
    """Forward ``request`` at once to every other worker holding partitions of ``table``, for an
    answer merged over the table that names what is missing instead of failing: each peer's
    answer, a 503 for one not answering within ``timeout_s``."""
    peers = peer_partitions(app, table)
    body = await request.read()
    answers = await asyncio.gather(
        *(forward_to(url, request, body, settings, timeout_s=timeout_s) for url in peers)
    )
    return [PeerAnswer(url, peers[url], answer) for url, answer in zip(peers, answers, strict=True)]


def table_peers(app: Any, table: Any) -> list[str] | None:
    """Base URLs of the other workers holding partitions of ``table``; ``None`` while some
    partition has no owner (a rebalance)."""
    topic = table.changelog_topic.get_topic_name()
    held: set[int] = set()
    peers: list[str] = []
    for url, topics in app.router.table_metadata(table.name).items():
        partitions = topics.get(topic, ())
        held.update(partitions)
        base = str(url).rstrip("/")
        if partitions and not is_local(app, base):
            peers.append(base)
    return peers if len(held) >= int(table.partitions) else None


async def answer_from_peers(
    app: Any, table: Any, request: web.Request, settings: Settings
) -> web.Response | None:
    """Ask every other worker holding ``table`` for a key this worker does not hold, when the
    key's partition cannot be derived from the request (a settlement instruction lives in the
    partition of its record). The first 200; a 503 when some peer could not answer (so "not
    found" is never claimed with part of the table unheard); ``None`` when no peer has it."""
    peers = table_peers(app, table)
    if peers is None:
        return rebalancing_answer("partition owner unknown")
    body = await request.read()
    unanswered: web.Response | None = None
    for peer in peers:
        answer = await forward_to(peer, request, body, settings)
        if answer.status == 200:
            return answer
        if answer.status != 404:
            unanswered = answer
    return unanswered


async def table_wide_request(
    app: Any, request: web.Request, settings: Settings, *, scope: Scope
) -> bool | web.Response:
    """The prologue of a route answered from the whole table, whose key's partition the request
    does not name: authenticate, claim the nonce unless a peer forwarded the request (it is
    claimed once, where the client called), and wait until this worker's partitions settle.
    Whether the request was forwarded, or the refusal (or 503) to send instead."""
    try:
        signed = await authenticate(request, settings, scope=scope, check_nonce=False)
        forwarded = is_forwarded(request, settings)
        if not forwarded:
            await claim_nonce(signed, settings)
    except RequestRefused as exc:
        return exc.response()
    if not await wait_settled(app):
        return unsettled_answer(app)
    return forwarded


async def answers_of_every_peer(
    app: Any, table: Any, request: web.Request, settings: Settings
) -> list[bytes] | web.Response:
    """The 200 bodies of every other worker holding ``table``, asked at once, for a listing
    that spans the whole table; the 503 to send instead while a partition has no owner or when
    some peer did not answer (a listing with part of the table unheard is never served)."""
    peers = table_peers(app, table)
    if peers is None:
        return rebalancing_answer("partition owner unknown")
    body = await request.read()
    answers = await asyncio.gather(*(forward_to(peer, request, body, settings) for peer in peers))
    for answer in answers:
        if answer.status != 200:
            log.info("a peer answered %d to a listing: answering 503", answer.status)
            return rebalancing_answer("a partition owner did not answer")
    return [cast(bytes, answer.body) for answer in answers]  # forward_to answers with bytes


def is_local(app: Any, url: str) -> bool:
    """Whether ``url`` is this worker."""
    return url == str(app.conf.canonical_url).rstrip("/")


async def answer_at_owner(
    app: Any, table: Any, signed: RecordRequest, request: web.Request, settings: Settings
) -> web.Response | None:
    """The answer to send: the owner's when another worker owns the record's partition of
    ``table``, a refusal when the nonce was used, a 503 with ``Retry-After`` while ownership is
    unsettled (after a bounded wait: a rebalance, a recovery, an unreachable or moved owner);
    ``None`` when this worker must answer (the nonce is then claimed)."""
    if not await wait_settled(app, settled=ownership_settled):
        return rebalancing_answer()
    owner = owner_url(app, table, signed.key)
    if owner is None:
        return rebalancing_answer("partition owner unknown")
    if not is_local(app, owner):
        if signed.forwarded:  # the sender's assignment is older than ours: never forward twice
            return rebalancing_answer("partition owner moved")
        return await forward_to(owner, request, signed.body, settings)
    if not await wait_settled(app):
        return unsettled_answer(app)
    try:
        await claim_nonce(signed.signed, settings)
    except RequestRefused as exc:
        return exc.response()
    return None


@dataclass(frozen=True, slots=True)
class RecordRequest:
    """A signed request about one record: the request, its record id and key, and whether a
    peer worker forwarded it."""

    signed: SignedRequest
    record_id: int
    key: bytes
    forwarded: bool

    @property
    def body(self) -> bytes:
        """The raw body."""
        return self.signed.body


#: Record ids are positive decimal integers of at most 19 digits (they fit a signed 64-bit int).
_MAX_RECORD_ID_DIGITS = 19


async def record_request(
    request: web.Request, avcc_record_id: str, settings: Settings, *, scope: Scope
) -> RecordRequest | web.Response:
    """Authenticate a ``/v1/.../{avcc_record_id}`` request (signature and scope; the nonce is
    claimed by :func:`answer_at_owner`) and parse its id; the refusal (401, 403, 400) otherwise."""
    try:
        signed = await authenticate(request, settings, scope=scope, check_nonce=False)
    except RequestRefused as exc:
        return exc.response()
    digits = avcc_record_id
    if not (digits.isascii() and digits.isdigit() and len(digits) <= _MAX_RECORD_ID_DIGITS):
        return json_error(
            400,
            "avcc_record_id: must be a decimal integer",
            reason="bad_parameter",
            fields=["avcc_record_id"],
        )
    record_id = int(digits)
    return RecordRequest(signed, record_id, record_key(record_id), is_forwarded(request, settings))
