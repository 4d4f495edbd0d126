"""Bulk applications (``POST /v1/avcc/applications:batch``): many works in one signed request.

A batch is a JSON array or NDJSON (read by :func:`app.platform.http.batch_body.parse_items`), at most
``AVCC_BULK_MAX_ITEMS`` items. Each item gets exactly the answer the single route would give
it: 202 with its record (a repeated ``request_id`` gets the same record again), 409 with the
record that already holds its ``content_hash``, or 400 naming the fields. The valid items are
claimed by the same claims agent as single applications, but batched: one ask per claims
partition carries all the batch's items of that partition, and the agent produces their
``apply.created`` events at once and waits for the acks once, so a batch costs a few round
trips instead of one per item.

Backpressure instead of timeouts: a worker holds at most ``AVCC_BULK_MAX_IN_FLIGHT`` items in
claims at a time, and a batch waits at most ``AVCC_BULK_CLAIM_WAIT_S`` for its answers. A batch
that does not fit is answered ``429`` with ``Retry-After`` before anything is produced; items not
answered in time are marked ``throttled`` (429 for the batch) while the answered ones keep their
results. A throttled item's claim goes on: resent with the same ``request_id`` it waits for
that same claim (no second ask piles up behind it), and gets the same record.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from app.lifecycle.code.claims import application_answer
from app.platform.http.batch_body import BatchError, parse_items
from app.platform.http.responses import BadRequest, validate_object
from schemas.application import ApplicationRequest

__all__ = [
    "THROTTLED",
    "AskMany",
    "BatchOutcome",
    "PendingClaims",
    "claim_batch",
    "read_batch",
]

log = logging.getLogger(__name__)

#: The per-item error of an item not claimed within the batch's wait (resend it as is).
THROTTLED: Final = "claim not answered in time; retry with the same request_id"

#: Asks the claims agent about applications of one claims partition, in one message; its
#: replies in the same order (see ``ClaimAnswer.as_reply``).
AskMany = Callable[[int, list[ApplicationRequest]], Awaitable[list[dict[str, Any]]]]


class PendingClaims:
    """The claims this worker has asked for: admission control of the bulk route, one ask per
    item however often it is resent, and the recent answers.

    An ask outlives the batch that made it (a throttled item's claim goes on), so a resent item
    joins its first ask instead of queueing a second one behind it, and the slots it holds are
    given back only when the claims agent has answered (or after ``ask_timeout_s``). The answer
    is then kept for ``keep_s`` (at most ``keep`` answers): a claim never changes once made, so a
    resent item is answered at once instead of being asked again at the back of the queue.
    """

    def __init__(self, limit: int, ask_timeout_s: float, keep: int = 20_000, keep_s: float = 300.0) -> None:
        self.limit = limit
        self.ask_timeout_s = ask_timeout_s
        self.keep = keep
        self.keep_s = keep_s
        self._asks: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = {}
        self._answers: OrderedDict[tuple[str, str], tuple[float, dict[str, Any]]] = OrderedDict()
        self._tasks: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        return len(self._asks)

    @staticmethod
    def _key(application: ApplicationRequest) -> tuple[str, str]:
        return application.content_hash, application.request_id

    def _known(self, key: tuple[str, str]) -> bool:
        return key in self._asks or key in self._answers

    def admits(self, applications: Sequence[ApplicationRequest]) -> bool:
        """Whether the asks these applications need fit under the limit (when idle, any batch
        fits: otherwise a batch larger than the limit could never pass)."""
        new = sum(1 for a in applications if not self._known(self._key(a)))
        return not self._asks or len(self._asks) + new <= self.limit

    def ask_all(
        self,
        applications: Sequence[ApplicationRequest],
        ask: AskMany,
        partition_of: Callable[[ApplicationRequest], int],
    ) -> list[asyncio.Future[dict[str, Any]]]:
        """The answer of each application: kept, pending, or asked now -- the new ones grouped by
        claims partition, one ask per partition (in input order within it)."""
        self._expire(time.monotonic())
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[dict[str, Any]]] = []
        groups: dict[int, list[tuple[ApplicationRequest, asyncio.Future[dict[str, Any]]]]] = {}
        for application in applications:
            key = self._key(application)
            future = self._asks.get(key)
            if future is None:
                future = loop.create_future()
                kept = self._answers.get(key)
                if kept is not None:
                    future.set_result(kept[1])
                else:
                    self._asks[key] = future
                    future.add_done_callback(functools.partial(self._settle, key))
                    groups.setdefault(partition_of(application), []).append((application, future))
            futures.append(future)
        for partition, group in groups.items():
            task = asyncio.ensure_future(self._ask_group(partition, group, ask))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return futures

    async def _ask_group(
        self,
        partition: int,
        group: list[tuple[ApplicationRequest, asyncio.Future[dict[str, Any]]]],
        ask: AskMany,
    ) -> None:
        try:
            replies = await asyncio.wait_for(ask(partition, [a for a, _ in group]), self.ask_timeout_s)
            if len(replies) != len(group):
                raise ValueError(f"{len(replies)} replies to {len(group)} claims")
        except (Exception, asyncio.CancelledError) as exc:
            for _, future in group:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else TimeoutError())
            return
        for (_, future), reply in zip(group, replies, strict=True):
            if not future.done():
                future.set_result(reply)

    def _settle(self, key: tuple[str, str], done: asyncio.Future[dict[str, Any]]) -> None:
        if self._asks.get(key) is done:
            del self._asks[key]
        if done.cancelled():
            return
        if (error := done.exception()) is not None:
            log.warning("claim of %s failed: %r", key[1], error)
            return
        self._answers[key] = (time.monotonic() + self.keep_s, done.result())
        while len(self._answers) > self.keep:
            self._answers.popitem(last=False)

    def _expire(self, now: float) -> None:
        while self._answers:
            key, (expires, _) = next(iter(self._answers.items()))
            if expires > now:
                return
            del self._answers[key]


def _item_error(index: int, message: str, fields: Sequence[str], reason: str) -> dict[str, Any]:
    """The answer of an item the single route would refuse with 400 (its body, and its index)."""
    return {"index": index, "http_status": 400, "error": message, "reason": reason, "fields": list(fields)}


def read_batch(
    body: bytes, content_type: str, max_items: int
) -> tuple[list[tuple[int, ApplicationRequest]], dict[int, dict[str, Any]]]:
    """The valid applications of a batch by index, and the 400 answer of every invalid item.

    Raises :class:`BatchError` when the body is not a batch at all (400/413/415).
    """
    try:
        items, line_errors = parse_items(body, content_type, max_items)
    except BatchError as exc:
        if exc.reason == "not_an_array":
            raise BatchError(400, exc.reason, "body: must be a JSON array of applications") from None
        raise
    valid: list[tuple[int, ApplicationRequest]] = []
    refused: dict[int, dict[str, Any]] = {}
    for index, item in enumerate(items):
        if index in line_errors:
            message = line_errors[index].replace("<root>:", "body:", 1)
            refused[index] = _item_error(index, message, ("body",), "malformed_json")
            continue
        try:
            valid.append((index, validate_object(ApplicationRequest, item)))
        except BadRequest as exc:
            refused[index] = _item_error(index, str(exc), exc.fields, exc.reason)
    return valid, refused


@dataclass(slots=True)
class BatchOutcome:
    """Per-item answers of a batch, in index order, and whether any was throttled."""

    items: list[dict[str, Any]] = field(default_factory=list)

    def count(self, http_status: int) -> int:
        """Items answered with ``http_status``."""
        return sum(1 for item in self.items if item["http_status"] == http_status)

    @property
    def status(self) -> int:
        """202 when every item has its final answer; 429 when some must be resent."""
        return 429 if self.count(429) else 202

    def body(self) -> dict[str, Any]:
        """``{"submitted", "conflicts", "rejected", "throttled", "items"}`` (a 429 also carries the
        common error fields)."""
        body: dict[str, Any] = {
            "submitted": self.count(202),
            "conflicts": self.count(409),
            "rejected": self.count(400),
            "throttled": self.count(429),
            "items": self.items,
        }
        if body["throttled"]:
            body.update(error="some items were not claimed in time; resend those", reason="throttled")
        return body


def _throttled(index: int, request_id: str) -> dict[str, Any]:
    return {
        "index": index,
        "http_status": 429,
        "request_id": request_id,
        "error": THROTTLED,
        "reason": "throttled",
    }


async def claim_batch(
    applications: Sequence[tuple[int, ApplicationRequest]],
    refused: dict[int, dict[str, Any]],
    pending: PendingClaims,
    ask: AskMany,
    partition_of: Callable[[ApplicationRequest], int],
    wait_s: float,
) -> BatchOutcome:
    """Ask for every claim at once (through ``pending``: one ask per claims partition), wait up
    to ``wait_s`` for the replies, answer each item; items not answered by then (or whose ask
    failed) are throttled."""
    asks = pending.ask_all([application for _, application in applications], ask, partition_of)
    if asks:
        await asyncio.wait(asks, timeout=wait_s)
    answers: dict[int, dict[str, Any]] = dict(refused)
    for (index, application), task in zip(applications, asks, strict=True):
        if not task.done() or task.cancelled() or task.exception() is not None:
            answers[index] = _throttled(index, application.request_id)
        else:
            status, answer = application_answer(application.request_id, task.result())
            answers[index] = {"index": index, "http_status": status, **answer}
    return BatchOutcome([answers[i] for i in sorted(answers)])
