"""Events are acked only once their processing is done (faust acks the event an agent was on
when its loop raised: a failed produce committed an event nobody processed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.platform.faust import runtime
from app.platform.faust.runtime import KeyedConcurrency, consume_each


class FakeStream:
    """The part of a faust stream the helpers use: ``noack()``, ``events()``, ``ack()``."""

    def __init__(self, events: list[Any]) -> None:
        self._events = events
        self.acked: list[Any] = []
        self.noack_called = False

    def noack(self) -> FakeStream:
        self.noack_called = True
        return self

    async def events(self) -> AsyncIterator[Any]:
        for event in self._events:
            yield event

    async def ack(self, event: Any) -> bool:
        self.acked.append(event)
        return True


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "UNDONE_RETRY_S", (0.001, 0.002))


async def test_a_failing_event_is_retried_in_place_and_acked_once_done() -> None:
    stream = FakeStream(["a", "b"])
    failures = {"a": 2}
    done: list[str] = []

    async def work(event: str) -> None:
        if failures.get(event):
            failures[event] -= 1
            raise RuntimeError("broker unreachable even for the retry topic")
        done.append(event)

    await consume_each(stream, work)
    assert stream.noack_called, "faust must not ack by itself"
    assert done == ["a", "b"], "nothing overtakes an event that failed"
    assert stream.acked == ["a", "b"]


async def test_an_event_whose_work_is_cancelled_is_not_acked() -> None:
    stream = FakeStream(["a"])
    started = asyncio.Event()

    async def work(event: str) -> None:
        started.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(consume_each(stream, work))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stream.acked == []


async def test_keyed_concurrency_retries_a_failed_event_before_the_next_of_its_key() -> None:
    class Event:
        def __init__(self, key: bytes, name: str) -> None:
            self.message = type("M", (), {"key": key})()
            self.name = name

    events = [Event(b"k", "first"), Event(b"k", "second"), Event(b"other", "third")]
    stream = FakeStream(events)
    failures = {"first": 1}
    done: list[str] = []

    async def work(event: Event) -> None:
        if failures.get(event.name):
            failures[event.name] -= 1
            raise RuntimeError("produce failed")
        done.append(event.name)

    await KeyedConcurrency(4).run(stream, work)
    for _ in range(100):
        if len(stream.acked) == 3:
            break
        await asyncio.sleep(0.01)
    assert done.index("first") < done.index("second")
    assert sorted(e.name for e in stream.acked) == ["first", "second", "third"]
