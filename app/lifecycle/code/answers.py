"""Claim answers awaited by the worker that owns a claims partition.

The owner of claims partition ``p`` answers claims itself: it produces the claim request to
``p`` with a fresh token, and its claims agent, once the request's ``apply.created`` events and
claims are durable, hands the replies to the waiting request here. No reply topic, and so no
reply a broker failover could deliver twice. When ``p`` moves to another worker before the
request was processed, its waiters are failed at once with :class:`ClaimMoved` (the new owner
processes the request; the client sends it again and gets the same record).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import Any

from app.platform.errors import DependencyUnavailable

__all__ = ["ClaimMoved", "ClaimWaiters"]


class ClaimMoved(DependencyUnavailable):
    """The claims partition moved to another worker before the claim was answered: send the
    same application (same ``request_id``) again."""


class ClaimWaiters:
    """Requests waiting for the claims agent's replies, by token."""

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[int, asyncio.Future[list[dict[str, Any]]]]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def expect(self, partition: int) -> tuple[str, asyncio.Future[list[dict[str, Any]]]]:
        """A new token for a claim request to ``partition`` and the future of its replies."""
        token = uuid.uuid4().hex
        future: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._waiting[token] = (partition, future)
        return token, future

    def forget(self, token: str) -> None:
        """Stop waiting for ``token`` (answered, timed out or cancelled)."""
        self._waiting.pop(token, None)

    def answer(self, token: str, replies: list[dict[str, Any]]) -> None:
        """Hand ``replies`` to the request waiting for ``token`` (nobody waiting: dropped)."""
        waiting = self._waiting.pop(token, None)
        if waiting is not None and not waiting[1].done():
            waiting[1].set_result(replies)

    def partitions_moved(self, partitions: Iterable[int]) -> None:
        """Fail every request waiting on one of ``partitions`` (revoked from this worker)."""
        moved = set(partitions)
        for token, (partition, future) in list(self._waiting.items()):
            if partition in moved:
                del self._waiting[token]
                if not future.done():
                    future.set_exception(ClaimMoved(f"claims partition {partition} moved; retry"))
