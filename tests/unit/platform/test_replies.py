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
from app.platform.metrics import REGISTRY


class Replies:
    def __init__(self, *correlation_ids: str) -> None:
        self.replies = [
            SimpleNamespace(correlation_id=c, value={"n": i}) for i, c in enumerate(correlation_ids)
        ]

    async def stream(self) -> AsyncIterator[Any]:
        for reply in self.replies:
            yield reply


def dropped(app_id: str, reason: str) -> float:
    value = REGISTRY.get_sample_value("avcc_replies_dropped_total", {"app": app_id, "reason": reason})
    return value or 0.0


def reply_consumer(app_id: str) -> Any:
    app = SimpleNamespace(conf=SimpleNamespace(id=app_id))
    return SimpleNamespace(_waiting=defaultdict(WeakSet), app=app)


async def test_a_duplicate_reply_is_ignored_instead_of_crashing_the_consumer() -> None:
    first = ReplyPromise(reply_to="replies", correlation_id="c1")
    second = ReplyPromise(reply_to="replies", correlation_id="c2")
    consumer = reply_consumer("avcc-replies-dup")
    consumer._waiting["c1"].add(first)
    consumer._waiting["c2"].add(second)
    await _ReplyConsumer._drain_replies(consumer, Replies("c1", "c1", "c2", "c1", "c2"))
    assert first.result() == {"n": 0}
    assert second.result() == {"n": 2}
    assert not consumer._waiting
    assert dropped("avcc-replies-dup", "nobody_waiting") == 3
    assert dropped("avcc-replies-dup", "already_answered") == 0


async def test_a_late_reply_and_a_reply_to_a_finished_promise_are_counted() -> None:
    answered = ReplyPromise(reply_to="replies", correlation_id="c1")
    answered.fulfill("c1", {"n": -1})  # answered already (a duplicate delivered concurrently)
    consumer = reply_consumer("avcc-replies-late")
    consumer._waiting["c1"].add(answered)
    await _ReplyConsumer._drain_replies(consumer, Replies("c1", "gone"))
    assert answered.result() == {"n": -1}
    assert dropped("avcc-replies-late", "already_answered") == 1
    assert dropped("avcc-replies-late", "nobody_waiting") == 1
