"""Blocking offset reads with a deadline, for the loops that must keep their pace.

librdkafka calls with a timeout do not always return (seen after an Apache Kafka restart: a
consumer's ``committed()`` lookup never came back). A loop awaiting such a call stops for good:
the worker's lag export, and with it the stall watchdog; the lag monitor, and with it every lag
alert. :func:`call_within` gives up waiting instead; the caller drops the client the call uses
and asks a fresh one next time, and the old client is released once its call has returned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

__all__ = ["call_within"]

T = TypeVar("T")


async def call_within(call: Callable[[], T], timeout_s: float, release: Callable[[], None]) -> T:
    """``call()`` in a worker thread; its result, or ``TimeoutError`` after ``timeout_s``.

    On a timeout ``release`` (closing the client ``call`` uses) runs once ``call`` has returned,
    in a worker thread as well: releasing the client under the call would free what it uses.
    """
    loop = asyncio.get_running_loop()
    pending = loop.run_in_executor(None, call)
    try:
        return await asyncio.wait_for(asyncio.shield(pending), timeout_s)
    except TimeoutError:

        def release_when_done(done: asyncio.Future[T]) -> None:
            if not done.cancelled():
                done.exception()  # retrieved: the caller gave the result up already
            loop.run_in_executor(None, release)

        pending.add_done_callback(release_when_done)
        raise
