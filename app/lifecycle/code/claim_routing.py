"""Where an application is claimed: on the worker that owns its claims partition.

The claims agent serialises concurrent requests for one work on the owner of its claims
partition: one work, one record, one code. Only that owner asks its claims agent
(:class:`~app.lifecycle.code.answers.ClaimWaiters` hands it the replies); any other worker asks
the owner with a peer call, ``POST /peer/claims/{partition}`` (:data:`PEER_CLAIMS`), which the
owner answers with the same replies. While ownership is unsettled, or the owner cannot be reached
or has lost the partition, the claim is :class:`~app.lifecycle.code.answers.ClaimMoved`: the
route answers "retry with the same request_id".
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import orjson
from aiohttp import web
from faust.types import TP

from app.lifecycle.code.answers import ClaimMoved, ClaimWaiters
from app.lifecycle.code.claims import CLAIM_TIMEOUT_S
from app.platform.faust.runtime import GroupRuntime
from app.platform.http.auth import read_body
from app.platform.http.peers import PeerError, is_peer_call
from app.platform.http.responses import RequestRefused, json_error, json_response
from app.platform.http.routing import OwnerRouting, partitions_settled, rebalancing_answer, wait_settled
from app.platform.kafka.partitioner import partition_for
from app.platform.metrics import STAGE_SECONDS
from app.platform.topics import CODE_CLAIMS
from schemas.application import ApplicationRequest

__all__ = ["PEER_CLAIMS", "ClaimRouting", "claims_partition"]

#: Path of the peer call that asks the owner of a claims partition to claim applications.
PEER_CLAIMS: Final = "/peer/claims/{partition}"


def claims_partition(application: ApplicationRequest) -> int:
    """The claims partition of an application (murmur2 of its content hash)."""
    return partition_for(application.content_hash.encode(), CODE_CLAIMS.partitions)


def _as_json(applications: list[ApplicationRequest]) -> list[dict[str, Any]]:
    return [a.model_dump(mode="json", exclude_none=True) for a in applications]


class ClaimRouting:
    """Claims of the code group's workers, asked where they are made (see the module docstring)."""

    def __init__(
        self, runtime: GroupRuntime, routing: OwnerRouting, waiters: ClaimWaiters, max_body_bytes: int
    ) -> None:
        self.app = runtime.app
        self.runtime = runtime
        self.routing = routing
        self.waiters = waiters
        self.max_body_bytes = max_body_bytes

    def owns(self, partition: int) -> bool:
        """Whether this worker holds claims ``partition`` (and its claims table partition)."""
        try:
            return TP(CODE_CLAIMS.name, partition) in self.app.consumer.assignment()
        except Exception:  # the consumer not started yet
            return False

    async def claim_here(
        self, partition: int, applications: list[ApplicationRequest]
    ) -> list[dict[str, Any]]:
        """Claim ``applications`` (all of claims ``partition``, which this worker owns): produce
        one claim request and wait for the claims agent's replies."""
        token, replies = self.waiters.expect(partition)
        try:
            value = orjson.dumps({"token": token, "body": orjson.dumps(_as_json(applications)).decode()})
            key = applications[0].content_hash.encode()
            await self.runtime.producer.send(CODE_CLAIMS, value, key, partition=partition)
            return await replies
        finally:
            self.waiters.forget(token)

    async def ask(self, partition: int, applications: list[ApplicationRequest]) -> list[dict[str, Any]]:
        """The claims agent's replies for applications of one claims partition: asked here when
        this worker owns it, else of its owner (a peer call). :class:`ClaimMoved` while ownership
        is unsettled or the owner cannot be reached (the route answers "retry")."""
        with STAGE_SECONDS.labels("claim").time():
            if not await wait_settled(self.app):
                raise ClaimMoved("partitions are being assigned; retry")
            if self.owns(partition):
                return await self.claim_here(partition, applications)
            path = PEER_CLAIMS.format(partition=partition)
            try:
                reply = await self.routing.call_owner(partition, path, orjson.dumps(_as_json(applications)))
            except PeerError as exc:
                raise ClaimMoved(f"owner of claims partition {partition}: {exc}") from exc
            if reply.status != 200:
                raise ClaimMoved(f"owner of claims partition {partition} answered {reply.status}")
            replies: list[dict[str, Any]] = orjson.loads(reply.body)["replies"]
            return replies

    async def answer_peer(self, request: web.Request, partition: str) -> web.Response:
        """The answer to a peer call ``POST /peer/claims/{partition}``: the replies of claiming
        its applications here, a 503 when this worker does not hold the partition (any more)."""
        try:
            body = await read_body(request, self.max_body_bytes, self.routing.settings.http_body_timeout_s)
        except RequestRefused as exc:
            return exc.response()
        if not is_peer_call(request, body, self.routing.settings):
            return json_error(401, "not a signed peer call", reason="peer_signature")
        if not (partition.isascii() and partition.isdigit() and int(partition) < CODE_CLAIMS.partitions):
            return json_error(
                400, "partition: not a claims partition", reason="bad_parameter", fields=["partition"]
            )
        number = int(partition)
        if not partitions_settled(self.app) or not self.owns(number):
            return rebalancing_answer(f"claims partition {number} is not held here")
        try:
            applications = [ApplicationRequest.model_validate(item) for item in orjson.loads(body)]
            replies = await asyncio.wait_for(self.claim_here(number, applications), CLAIM_TIMEOUT_S)
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
