"""A group's own consumer, run beside faust for the life of the worker: one service wrapper.

The sink, the anomaly detector, the retry forwarder and the DLQ indexer consume with a
confluent-kafka consumer of their own (:class:`~app.platform.kafka.consumer_loop.ConsumerLoop`)
instead of faust agents. Each is an :class:`OwnConsumer`; :func:`own_consumer` wraps one in the
one service that builds it off the event loop when the worker starts, runs it, crashes the worker
when it fails (so it is restarted instead of consuming without its state), stops it with the
worker, and lets ``/ready`` and the worker's lag export follow its assignment. The wrapper holds
the running consumer (:attr:`OwnConsumerService.running`): the one place it is kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import faust
from mode import Service

from app.platform.faust.readiness import WorkerState
from app.platform.http.views import install_common_views

__all__ = ["OwnConsumer", "OwnConsumerService", "own_consumer"]

log = logging.getLogger(__name__)


class OwnConsumer(Protocol):
    """What a group runs with its own consumer (sink, anomaly, retry, DLQ)."""

    async def serve(self) -> None:
        """Consume until :meth:`stop`; return after the last checkpoint, the clients closed. An
        exception is a crash: the worker stops."""

    def stop(self) -> None:
        """Ask :meth:`serve` to return soon (from any thread)."""

    def assignment(self) -> list[tuple[str, int]]:
        """``(topic, partition)`` pairs the consumer owns now."""

    def readiness(self) -> tuple[bool, str]:
        """``(ready, why not)`` beyond having partitions."""


C = TypeVar("C", bound=OwnConsumer)


class OwnConsumerService(Service, Generic[C]):
    """Builds, runs and stops one :class:`OwnConsumer` for the life of the worker."""

    def __init__(self, factory: Callable[[], C], *, stop_timeout_s: float = 60.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factory = factory
        self.stop_timeout_s = stop_timeout_s
        #: The running consumer (``None`` before the worker started it and after it stopped).
        self.running: C | None = None
        self._serving: asyncio.Task[None] | None = None

    async def on_start(self) -> None:
        """Build the consumer off the event loop (it may connect to its stores) and run it."""
        consumer = await asyncio.get_running_loop().run_in_executor(None, self.factory)
        self.running = consumer
        self._serving = asyncio.ensure_future(self._serve(consumer))

    async def _serve(self, consumer: C) -> None:
        try:
            await consumer.serve()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s crashed", type(consumer).__name__)
            await self.crash(exc)

    async def on_stop(self) -> None:
        """Stop the consumer and wait (at most ``stop_timeout_s``) for its last checkpoint."""
        consumer, serving = self.running, self._serving
        self.running = self._serving = None
        if consumer is None or serving is None:
            return
        consumer.stop()
        try:
            await asyncio.wait_for(asyncio.shield(serving), self.stop_timeout_s)
        except TimeoutError:
            log.error("%s did not stop within %.0f s", type(consumer).__name__, self.stop_timeout_s)

    def assignment(self) -> list[tuple[str, int]]:
        """The running consumer's assignment (``RuntimeError`` while none runs: not ready)."""
        if self.running is None:
            raise RuntimeError("the group's consumer is not running")
        return self.running.assignment()

    def readiness(self) -> tuple[bool, str]:
        """The running consumer's readiness."""
        if self.running is None:
            return False, "the group's consumer is not running"
        return self.running.readiness()


def own_consumer(
    app: faust.App, group: str, factory: Callable[[], C], *, stop_timeout_s: float = 60.0
) -> tuple[OwnConsumerService[C], WorkerState]:
    """Run ``factory()``'s consumer with ``app``'s worker, with the common views following it
    (``/ready``, the lag export); the service and the views' state."""
    service: OwnConsumerService[C] = OwnConsumerService(factory, stop_timeout_s=stop_timeout_s)
    state = install_common_views(app, group, assignment=service.assignment, ready_check=service.readiness)
    app.service(service)  # type: ignore[arg-type]  # faust takes a service instance too
    return service, state
