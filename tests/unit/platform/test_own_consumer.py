"""The one service wrapper of a group's own consumer: built off the event loop, run with the
worker, its crash crashes the worker, stopped with it; ``/ready`` follows it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from app.platform.faust.own_consumer import OwnConsumerService
from app.platform.kafka.consumer_loop import in_thread


class Consumer:
    """A consumer that serves until stopped (or fails at once when ``fails``)."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.built_on = threading.current_thread().name
        self.stopped = asyncio.Event()
        self.served = False

    async def serve(self) -> None:
        self.served = True
        if self.fails:
            raise RuntimeError("the changelog is unwritable")
        await self.stopped.wait()

    def stop(self) -> None:
        self.stopped.set()

    def assignment(self) -> list[tuple[str, int]]:
        return [("t", 0)]

    def readiness(self) -> tuple[bool, str]:
        return True, ""


async def test_the_consumer_is_built_off_the_loop_runs_with_the_worker_and_stops_with_it() -> None:
    service: OwnConsumerService[Consumer] = OwnConsumerService(Consumer)
    with pytest.raises(RuntimeError, match="not running"):
        service.assignment()
    assert service.readiness() == (False, "the group's consumer is not running")
    await service.on_start()
    consumer = service.running
    assert consumer is not None and consumer.built_on != threading.current_thread().name
    await asyncio.sleep(0)
    assert consumer.served and service.assignment() == [("t", 0)] and service.readiness() == (True, "")
    await service.on_stop()
    assert consumer.stopped.is_set() and service.running is None


async def test_a_crash_of_the_consumer_crashes_the_worker() -> None:
    crashes: list[BaseException] = []
    service: OwnConsumerService[Consumer] = OwnConsumerService(lambda: Consumer(fails=True))

    async def crash(exc: BaseException) -> None:
        crashes.append(exc)

    service.crash = crash  # type: ignore[method-assign]
    await service.on_start()
    for _ in range(100):
        if crashes:
            break
        await asyncio.sleep(0.01)
    assert [str(exc) for exc in crashes] == ["the changelog is unwritable"]
    await service.on_stop()


async def test_a_blocking_loop_runs_on_a_thread_of_its_own_and_its_error_is_raised() -> None:
    names: list[str] = []

    def loop() -> None:
        names.append(threading.current_thread().name)

    def broken() -> Any:
        raise ValueError("boom")

    await in_thread(loop, "own-loop")
    assert names == ["own-loop"]
    with pytest.raises(ValueError, match="boom"):
        await in_thread(broken, "own-loop")
