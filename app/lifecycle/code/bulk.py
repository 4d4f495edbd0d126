"""Bulk applications (``POST /v1/avcc/applications:batch``): many works in one signed request.

A batch is a JSON array or NDJSON (the gateway's reader, :func:`parse_items`), at most
``AVCC_BULK_MAX_ITEMS`` items. Each item gets exactly the answer the single route would give
it: 202 with its record (a repeated ``request_id`` gets the same record again), 409 with the
record that already holds its ``content_hash``, or 400 naming the fields. The valid items are
claimed through the same claims agent as single applications, but all at once: every ask is
produced before the first reply is awaited, so one batch costs one round of claims instead of
one round trip per item.

Backpressure instead of timeouts: a worker holds at most ``AVCC_BULK_MAX_IN_FLIGHT`` items in
claims at a time, and a batch waits at most ``AVCC_BULK_CLAIM_WAIT_S`` for its answers. A batch
that does not fit, or items not answered in time, are answered ``429`` with ``Retry-After``;
the items answered in time keep their results, the others are marked ``throttled``. Resending a
throttled item with the same ``request_id`` is safe: if its claim was made after all, the retry
gets the same record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.lifecycle.code.claims import application_answer
from app.platform.http.responses import BadRequest, validate_object
from app.playback.gateway.ingest import BatchError, parse_items
from schemas.application import ApplicationRequest

__all__ = [
    "THROTTLED",
    "Ask",
    "BatchOutcome",
    "BulkSettings",
    "InFlight",
    "claim_batch",
    "read_batch",
]

log = logging.getLogger(__name__)

#: The per-item error of an item not claimed within the batch's wait (resend it as is).
THROTTLED: Final = "claim not answered in time; retry with the same request_id"

#: Asks the claims agent about one application; its reply (see ``ClaimAnswer.as_reply``).
Ask = Callable[[ApplicationRequest], Awaitable[dict[str, Any]]]


class BulkSettings(BaseSettings):
    """Limits of the bulk route of the code group. Each field maps to ``AVCC_BULK_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_BULK_", frozen=True, extra="ignore")

    max_items: int = Field(default=1_000, ge=1, description="Most applications per batch (more: 413).")
    max_body_bytes: int = Field(
        default=2 * 1024 * 1024, ge=1024, description="Largest batch body in bytes (more: 413)."
    )
    max_in_flight: int = Field(
        default=4_000,
        ge=1,
        description="Applications a code worker holds in claims at once; a batch that does not fit "
        "is answered 429 with Retry-After.",
    )
    claim_wait_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest a batch waits for its claims; items not answered by then are "
        "answered 429 (throttled) instead of timing out.",
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After of a 429 batch answer.")


class InFlight:
    """Items this worker has in claims now, bounded: admission control of the bulk route."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def take(self, items: int) -> bool:
        """Reserve ``items`` slots; ``False`` (nothing reserved) when they do not fit."""
        if self.count + items > self.limit and self.count > 0:
            return False
        self.count += items
        return True

    def release(self, items: int) -> None:
        """Give back slots reserved by :meth:`take`."""
        self.count = max(0, self.count - items)


def _item_error(index: int, message: str, fields: Sequence[str]) -> dict[str, Any]:
    return {"index": index, "http_status": 400, "error": message, "fields": list(fields)}


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
            refused[index] = _item_error(index, line_errors[index].replace("<root>:", "body:", 1), ("body",))
            continue
        try:
            valid.append((index, validate_object(ApplicationRequest, item)))
        except BadRequest as exc:
            refused[index] = _item_error(index, str(exc), exc.fields)
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
    ask: Ask,
    wait_s: float,
) -> BatchOutcome:
    """Ask for every claim at once, wait up to ``wait_s`` for the replies, answer each item.

    Items not answered by then (or whose ask failed) are throttled; their asks are cancelled,
    which cannot undo a claim already made, hence the advice to resend the same request_id.
    """
    asks = {index: asyncio.ensure_future(ask(application)) for index, application in applications}
    if asks:
        _, pending = await asyncio.wait(asks.values(), timeout=wait_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    answers: dict[int, dict[str, Any]] = dict(refused)
    for index, application in applications:
        task = asks[index]
        if task.cancelled():
            answers[index] = _throttled(index, application.request_id)
        elif (error := task.exception()) is not None:
            log.warning("claim of batch item %d failed: %r", index, error)
            answers[index] = _throttled(index, application.request_id)
        else:
            status, answer = application_answer(application.request_id, task.result())
            answers[index] = {"index": index, "http_status": status, **answer}
    return BatchOutcome([answers[i] for i in sorted(answers)])
