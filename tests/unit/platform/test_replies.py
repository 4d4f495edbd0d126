"""A reply that arrives twice (non-idempotent reply producer, redelivered request) must not crash
the asking worker's reply consumer."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any
from weakref import WeakSet

from faust.agents.replies import ReplyPromise

from app.platform.faust.app import _ReplyConsumer


class Replies:
    def __init__(self, *correlation_ids: str) -> None:
        self.replies = [
            SimpleNamespace(correlation_id=c, value={"n": i}) for i, c in enumerate(correlation_ids)
        ]

    async def stream(self) -> AsyncIterator[Any]:
        for reply in self.replies:
            yield reply


async def test_a_duplicate_reply_is_ignored_instead_of_crashing_the_consumer() -> None:
    first = ReplyPromise(reply_to="replies", correlation_id="c1")
    second = ReplyPromise(reply_to="replies", correlation_id="c2")
    consumer = SimpleNamespace(_waiting=defaultdict(WeakSet))
    consumer._waiting["c1"].add(first)
    consumer._waiting["c2"].add(second)
    await _ReplyConsumer._drain_replies(consumer, Replies("c1", "c1", "c2", "c1"))  # type: ignore[arg-type]
    assert first.result() == {"n": 0}
    assert second.result() == {"n": 2}
    assert not consumer._waiting
