"""The producer flush faust calls before it commits offsets waits for every buffered message
(table changelog writes) to be acknowledged, and fails when one was refused: faust's own flush
gave up after 0.1 s without a send, so a commit could cover writes a SIGKILL then lost."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faust.types import FutureMessage

from app.platform.faust.app import get_app
from app.platform.faust.producer import Producer


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The code group's producer, its buffer and faust's own flush taken out: like a flush
    during a broker failover, which returns with messages still on their way."""
    producer = get_app("code").producer
    assert isinstance(producer, Producer)
    producer._undelivered.clear()
    monkeypatch.setattr(producer.buffer, "put", lambda fut: None)

    async def gave_up() -> None:
        return None

    monkeypatch.setattr(type(producer).__mro__[1], "flush", lambda self: gave_up())
    return producer


def changelog_write(n: int) -> FutureMessage:
    """A buffered write (what a table assignment hands to ``send_soon``)."""
    return get_app("code").topic("avcc-code-claims-changelog").as_future_message(key=b"k%d" % n, value=b"v")


async def test_flush_returns_only_once_every_buffered_write_is_acknowledged(producer: Any) -> None:
    writes = [changelog_write(n) for n in range(3)]
    for write in writes:
        producer.send_soon(write)
    flush = asyncio.ensure_future(producer.flush())
    for write in writes[:2]:
        write.set_result(None)
    await asyncio.sleep(0.3)
    assert not flush.done(), "a commit could cover a write still on its way"
    writes[2].set_result(None)
    await asyncio.wait_for(flush, 1)
    assert not producer._undelivered


async def test_flush_fails_when_a_write_was_refused(producer: Any) -> None:
    write = changelog_write(0)
    producer.send_soon(write)
    write.set_exception(RuntimeError("NOT_ENOUGH_REPLICAS"))
    with pytest.raises(RuntimeError, match="NOT_ENOUGH_REPLICAS"):
        await producer.flush()


async def test_flush_with_nothing_buffered_returns_at_once(producer: Any) -> None:
    await asyncio.wait_for(producer.flush(), 0.5)
