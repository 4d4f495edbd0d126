"""faust's producer with the delivery guarantees table changelogs need before a commit.

A table assignment hands its changelog write to faust's producer buffer (``send_soon``), and
faust flushes that buffer before it commits offsets. Two gaps in faust 0.15 are closed here:

* **The flush waits for the acks.** faust's own flush gives up after 0.1 s without a send, so a
  commit could cover changelog writes still on their way, which a SIGKILL then lost.
  :meth:`Producer.flush` returns once every buffered write is acknowledged and raises if one was
  refused (the commit then does not happen; the events are processed again).
* **The buffer's sender survives a refused send.** faust's buffer hands each write to the
  client in one background task; an exception from the client (no metadata for the topic while
  a broker restarts, a leader moving) ended that task, so every later write stayed buffered
  and every later commit waited for it forever. Here a retriable error is retried with backoff,
  in order, and any other error fails that write's future, which makes the next flush raise.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from faust.exceptions import ProducerSendError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from faust.types import FutureMessage
from mode.utils.objects import cached_property

from app.platform.metrics import PRODUCER_SEND_RETRIES

__all__ = ["SEND_RETRY_MAX_S", "SEND_RETRY_S", "Producer", "SendBuffer"]

#: First and longest wait before a buffered write whose send was refused is sent again.
SEND_RETRY_S = 0.1
SEND_RETRY_MAX_S = 5.0

log = logging.getLogger(__name__)


def _retriable(exc: BaseException) -> bool:
    """Whether the client refused a send for a reason that passes (its Kafka error says so)."""
    cause = exc.__cause__ if isinstance(exc, ProducerSendError) and exc.__cause__ is not None else exc
    return bool(getattr(cause, "retriable", False))


def _topic(fut: FutureMessage) -> str:
    """The topic a buffered write goes to (its channel's name)."""
    channel: Any = fut.message.channel
    return str(channel.get_topic_name()) if hasattr(channel, "get_topic_name") else str(channel)


class SendBuffer(ProducerBuffer):
    """faust's producer buffer whose sender retries a refused write instead of dying."""

    async def _send_pending(self, fut: FutureMessage) -> None:
        delay = SEND_RETRY_S
        while True:
            try:
                await super()._send_pending(fut)
                return
            except Exception as exc:  # (a cancellation is not an Exception: it ends the sender)
                topic = _topic(fut)
                if self.should_stop or not _retriable(exc):
                    log.error("buffered write to %s refused: %r", topic, exc)
                    if not fut.done():
                        fut.set_exception(exc)
                    return
                PRODUCER_SEND_RETRIES.labels(topic).inc()
                log.warning("buffered write to %s refused, sent again in %.1f s: %r", topic, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, SEND_RETRY_MAX_S)


class Producer(faust_aiokafka.Producer):
    """The aiokafka producer with :class:`SendBuffer` and a flush that waits for the acks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        buffer = SendBuffer(loop=self.loop, beacon=self.beacon)
        buffer.app = self.app
        self.buffer = buffer

    @cached_property
    def _undelivered(self) -> set[FutureMessage]:
        """Messages handed to :meth:`send_soon` (table changelog writes) not yet acknowledged."""
        return set()

    def send_soon(self, fut: FutureMessage) -> None:
        """Buffer ``fut`` and track it until the broker acknowledges it (or refuses it)."""
        undelivered = self._undelivered
        undelivered.add(fut)
        fut.add_done_callback(undelivered.discard)
        super().send_soon(fut)

    async def flush(self) -> None:
        """Return once every message buffered so far is acknowledged; raise if one was refused."""
        await super().flush()
        pending = list(self._undelivered)
        if pending:
            await asyncio.gather(*pending)
