"""The sender of faust's producer buffer (table changelog writes) survives a refused send: a
retriable refusal is sent again in order, any other fails that write alone. faust's own sender
task ended at the first exception, and every later commit then waited forever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka.errors import MessageSizeTooLargeError, UnknownTopicOrPartitionError
from faust.exceptions import ProducerSendError
from faust.transport.producer import ProducerBuffer
from faust.types import FutureMessage

from app.platform.faust import producer as producer_module
from app.platform.faust.app import get_app
from app.platform.faust.producer import Producer, SendBuffer
from app.platform.metrics import PRODUCER_SEND_RETRIES

TOPIC = "avcc-code-claims-changelog"


def changelog_write(n: int) -> FutureMessage:
    """A buffered write (what a table assignment hands to ``send_soon``)."""
    return get_app("code").topic(TOPIC).as_future_message(key=b"k%d" % n, value=b"v")


class Client:
    """Stands in for the Kafka client behind faust's ``publish_message``: refuses the sends it
    was told to refuse (by write number), acknowledges the rest, and records the order."""

    def __init__(self, refusals: dict[int, list[Exception]]) -> None:
        self.refusals = refusals
        self.sent: list[int] = []

    async def send(self, fut: FutureMessage) -> None:
        n = int(bytes(fut.message.key)[1:])  # type: ignore[arg-type]
        pending = self.refusals.get(n)
        if pending:
            raise pending.pop(0)
        self.sent.append(n)
        fut.set_result(None)  # type: ignore[arg-type]


@pytest.fixture
async def started(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[SendBuffer, Client]]:
    monkeypatch.setattr(producer_module, "SEND_RETRY_S", 0.01)
    client = Client({})
    monkeypatch.setattr(ProducerBuffer, "_send_pending", lambda self, fut: client.send(fut))
    buffer = SendBuffer()
    buffer.app = get_app("code")
    await buffer.start()
    try:
        yield buffer, client
    finally:
        await buffer.stop()


def refused(exc: Exception) -> ProducerSendError:
    """What faust's aiokafka producer raises when the client refuses a send."""
    try:
        raise ProducerSendError(f"Error while sending: {exc!r}") from exc
    except ProducerSendError as wrapped:
        return wrapped


def test_the_apps_producer_buffers_through_the_surviving_sender() -> None:
    producer = get_app("code").producer
    assert isinstance(producer, Producer)
    assert isinstance(producer.buffer, SendBuffer)


async def test_a_retriable_refusal_is_sent_again_before_later_writes(started: Any) -> None:
    buffer, client = started
    client.refusals[0] = [refused(UnknownTopicOrPartitionError()), refused(UnknownTopicOrPartitionError())]
    before = PRODUCER_SEND_RETRIES.labels(TOPIC)._value.get()
    writes = [changelog_write(n) for n in range(3)]
    for write in writes:
        buffer.put(write)
    await asyncio.wait_for(asyncio.gather(*writes), 2)
    assert client.sent == [0, 1, 2]
    assert PRODUCER_SEND_RETRIES.labels(TOPIC)._value.get() - before == 2


async def test_a_lasting_refusal_fails_its_write_and_the_sender_goes_on(started: Any) -> None:
    buffer, client = started
    client.refusals[0] = [refused(MessageSizeTooLargeError())]
    writes = [changelog_write(n) for n in range(2)]
    for write in writes:
        buffer.put(write)
    with pytest.raises(ProducerSendError, match="MessageSizeTooLarge"):
        await asyncio.wait_for(writes[0], 2)
    await asyncio.wait_for(writes[1], 2)
    assert client.sent == [1]
