"""Owner routing of one table: who holds which partition, and the calls to them.

A record's state lives on the worker owning its table partition. :class:`OwnerRouting` is the
one component that knows, for one table, the owner of a key or a partition and the other workers
holding partitions (faust's assignment metadata of the table's changelog), and that calls them,
always through :class:`~app.platform.http.peers.PeerCalls` and signed as peer calls
(:mod:`app.platform.http.peers`):

* **to the owner** (:meth:`OwnerRouting.answer_at_owner`): any worker accepts a request about one
  record, checks its signature and scope, and forwards it to the owner, which checks it again
  and claims its nonce: a request is claimed only where it is answered, so the same request sent
  to two replicas meets its first claim in the shared nonce store whichever replica owns it;
* **to every peer** (:meth:`OwnerRouting.fan_out`), with an explicit policy (:data:`FanOutPolicy`)
  for a request the table answers as a whole: ``first`` (a key whose partition the request does
  not name: the first peer holding it answers), ``all`` (a listing served only whole) or
  ``merge`` (a summary naming each peer that did not answer);
* **a peer call** to the owner of a partition (:meth:`OwnerRouting.call_owner`), such as the
  code group's claims.

While ownership is unsettled (a rebalance, a recovery, an owner that moved or cannot be reached)
a request is answered 503 with ``Retry-After`` after a bounded wait, never a wrong 404 and never
forwarded twice.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from aiohttp import web

from app.platform.credentials import Scope
from app.platform.faust.recovery import restoring, table_recovery
from app.platform.http.auth import SignedRequest, authenticate, claim_nonce
from app.platform.http.peers import PeerCalls, PeerReply, PeerUnreachable, is_peer_call
from app.platform.http.responses import RequestRefused, json_error
from app.platform.kafka.partitioner import partition_for, record_key
from app.platform.settings import Settings

__all__ = [
    "FORWARD_TIMEOUT_S",
    "SETTLE_WAIT_S",
    "FanOut",
    "FanOutPolicy",
    "OwnerRouting",
    "PeerAnswer",
    "RecordRequest",
    "ownership_settled",
    "partitions_settled",
    "rebalancing_answer",
    "unsettled_answer",
    "wait_settled",
]

log = logging.getLogger(__name__)

#: Longest wait for a forwarded request's answer.
FORWARD_TIMEOUT_S = 15.0
#: Longest wait of a request for this worker's partitions to settle before it answers 503.
SETTLE_WAIT_S = 5.0
#: Record ids are positive decimal integers of at most 19 digits (they fit a signed 64-bit int).
_MAX_RECORD_ID_DIGITS = 19

#: How a request the table answers as a whole is put to the peers: ``first`` asks them in turn
#: until one answers 200 (every partition must have an owner, and "not found" is never claimed
#: with a peer unheard); ``all`` asks them at once and wants every answer (a listing is never
#: served with part of the table unheard); ``merge`` asks them at once and keeps whatever each
#: answers (a summary names the peers that did not answer and the partitions they held).
FanOutPolicy = Literal["first", "all", "merge"]


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


def _relayed(reply: PeerReply) -> web.Response:
    """The answer of another worker, relayed as it is (its ``Retry-After`` included)."""
    retry_after = reply.headers.get("Retry-After")
    return web.Response(
        body=reply.body,
        status=reply.status,
        content_type=reply.headers.get("Content-Type", "application/json").split(";")[0],
        headers={"Retry-After": retry_after} if retry_after else None,
    )


def _unreachable() -> web.Response:
    return json_error(
        503, "partition owner unreachable (failover); retry", reason="owner_unreachable", retry_after_s=1
    )


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


@dataclass(frozen=True, slots=True)
class PeerAnswer:
    """Another worker holding partitions of the table, and what it answered a forwarded request."""

    url: str
    partitions: tuple[int, ...]
    answer: web.Response

    @property
    def body(self) -> bytes:
        """The answer's body (a relayed answer always holds bytes)."""
        return cast(bytes, self.answer.body)


@dataclass(slots=True)
class FanOut:
    """What the peers answered a request under a :data:`FanOutPolicy`: their answers (``first``:
    the one that had it, if any; ``all``: every one, each a 200; ``merge``: every one), or the
    answer to send instead (``refusal``: a 503 while a partition has no owner or a peer was
    unheard)."""

    answers: list[PeerAnswer] = field(default_factory=list)
    refusal: web.Response | None = None


class OwnerRouting:
    """The owners of one table's partitions, and every call to them (see the module docstring)."""

    def __init__(self, app: Any, table: Any, settings: Settings, calls: PeerCalls | None = None) -> None:
        self.app = app
        self.table = table
        self.settings = settings
        self.calls = calls if calls is not None else PeerCalls(settings, FORWARD_TIMEOUT_S)

    # -- who holds what ------------------------------------------------------------------------

    def holders(self) -> dict[str, tuple[int, ...]]:
        """Base URL -> the partitions of the table it holds, for every worker holding some (this
        one included), from faust's assignment metadata of the table's changelog topic."""
        topic = self.table.changelog_topic.get_topic_name()
        held: dict[str, tuple[int, ...]] = {}
        for url, topics in self.app.router.table_metadata(self.table.name).items():
            partitions = tuple(sorted(topics.get(topic, ())))
            if partitions:
                held[str(url).rstrip("/")] = partitions
        return held

    def peers(self) -> dict[str, tuple[int, ...]]:
        """:meth:`holders` without this worker."""
        return {url: held for url, held in self.holders().items() if not self.is_local(url)}

    def complete(self) -> bool:
        """Whether every partition of the table has an owner (not so during a rebalance)."""
        held = {p for partitions in self.holders().values() for p in partitions}
        return len(held) >= int(self.table.partitions)

    def owner(self, partition: int) -> str | None:
        """Base URL of the worker that owns ``partition`` (``None`` if unknown)."""
        for url, held in self.holders().items():
            if partition in held:
                return url
        return None

    def owner_of_key(self, key: bytes) -> str | None:
        """Base URL of the worker that owns ``key``'s partition (murmur2 of the key, as every
        producer computes it; ``None`` if unknown)."""
        return self.owner(partition_for(key, int(self.table.partitions)))

    def is_local(self, url: str) -> bool:
        """Whether ``url`` is this worker."""
        return url == str(self.app.conf.canonical_url).rstrip("/")

    # -- calls ---------------------------------------------------------------------------------

    async def forward(
        self, url: str, request: web.Request, body: bytes, *, timeout_s: float = FORWARD_TIMEOUT_S
    ) -> web.Response:
        """Send ``request`` (with its body) to the worker at ``url`` as a peer call and relay its
        answer; a 503 with ``Retry-After`` when that worker cannot be reached within ``timeout_s``
        (killed, hung, restarting: the assignment still names it until the group rebalances)."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in {"host", "content-length"}}
        try:
            reply = await self.calls.request(
                url, request.method, request.path_qs, body, headers=headers, timeout_s=timeout_s
            )
        except PeerUnreachable as exc:
            log.info("owner %s unreachable (%s): answering 503", url, exc)
            return _unreachable()
        return _relayed(reply)

    async def call_owner(self, partition: int, path: str, body: bytes) -> PeerReply:
        """A peer call ``POST path`` to the owner of ``partition`` (not this worker): its reply.
        :class:`~app.platform.http.peers.PeerUnreachable` when it has no owner or does not answer."""
        owner = self.owner(partition)
        if owner is None:
            raise PeerUnreachable(f"partition {partition} of {self.table.name} has no owner yet")
        return await self.calls.request(
            owner, "POST", path, body, headers={"Content-Type": "application/json"}
        )

    async def fan_out(
        self, request: web.Request, policy: FanOutPolicy, *, timeout_s: float = FORWARD_TIMEOUT_S
    ) -> FanOut:
        """Forward ``request`` to every other worker holding partitions of the table, under
        ``policy`` (:data:`FanOutPolicy`)."""
        if policy != "merge" and not self.complete():
            return FanOut(refusal=rebalancing_answer("partition owner unknown"))
        peers = self.peers()
        body = await request.read()
        if policy == "first":
            unheard: web.Response | None = None
            for url, held in peers.items():
                answer = await self.forward(url, request, body, timeout_s=timeout_s)
                if answer.status == 200:
                    return FanOut([PeerAnswer(url, held, answer)])
                if answer.status != 404:
                    unheard = answer
            return FanOut(refusal=unheard)
        answers = await asyncio.gather(
            *(self.forward(url, request, body, timeout_s=timeout_s) for url in peers)
        )
        fanned = FanOut([PeerAnswer(url, peers[url], a) for url, a in zip(peers, answers, strict=True)])
        if policy == "all" and any(a.answer.status != 200 for a in fanned.answers):
            log.info("a peer did not answer 200 to a request of the whole table: answering 503")
            return FanOut(refusal=rebalancing_answer("a partition owner did not answer"))
        return fanned

    # -- the prologues of the routes -----------------------------------------------------------

    async def record_request(
        self, request: web.Request, avcc_record_id: str, *, scope: Scope
    ) -> RecordRequest | web.Response:
        """Authenticate a ``/v1/.../{avcc_record_id}`` request (signature and scope; the nonce is
        claimed by :meth:`answer_at_owner`) and parse its id; the refusal (401, 403, 400) else."""
        try:
            signed = await authenticate(request, self.settings, scope=scope, check_nonce=False)
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
        forwarded = is_peer_call(request, signed.body, self.settings)
        return RecordRequest(signed, record_id, record_key(record_id), forwarded)

    async def answer_at_owner(self, signed: RecordRequest, request: web.Request) -> web.Response | None:
        """The answer to send: the owner's when another worker owns the record's partition, a
        refusal when the nonce was used, a 503 with ``Retry-After`` while ownership is unsettled
        (after a bounded wait: a rebalance, a recovery, an unreachable or moved owner); ``None``
        when this worker must answer (the nonce is then claimed)."""
        if not await wait_settled(self.app, settled=ownership_settled):
            return rebalancing_answer()
        owner = self.owner_of_key(signed.key)
        if owner is None:
            return rebalancing_answer("partition owner unknown")
        if not self.is_local(owner):
            if signed.forwarded:  # the sender's assignment is older than ours: never forward twice
                return rebalancing_answer("partition owner moved")
            return await self.forward(owner, request, signed.body)
        if not await wait_settled(self.app):
            return unsettled_answer(self.app)
        try:
            await claim_nonce(signed.signed, self.settings)
        except RequestRefused as exc:
            return exc.response()
        return None

    async def table_wide_request(self, request: web.Request, *, scope: Scope) -> bool | web.Response:
        """The prologue of a route answered from the whole table, whose key's partition the
        request does not name: authenticate, claim the nonce unless a peer forwarded the request
        (it is claimed once, where the client called), and wait until this worker's partitions
        settle. Whether the request was forwarded, or the refusal (or 503) to send instead."""
        try:
            signed = await authenticate(request, self.settings, scope=scope, check_nonce=False)
            forwarded = is_peer_call(request, signed.body, self.settings)
            if not forwarded:
                await claim_nonce(signed, self.settings)
        except RequestRefused as exc:
            return exc.response()
        if not await wait_settled(self.app):
            return unsettled_answer(self.app)
        return forwarded
