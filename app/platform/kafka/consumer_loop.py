"""The base of every loop that consumes with a raw confluent-kafka consumer (sink, anomaly,
retry forwarder, DLQ indexer).

A confluent-kafka consumer must be used from one thread. :class:`ConsumerLoop` owns that
consumer, its subscription and the set of partitions it holds, so each loop writes only what
it does with a batch:

* a synchronous loop (sink, anomaly) runs in a thread of its own (:func:`in_thread`) and calls
  :meth:`open`, ``self.consumer.consume(...)`` and :meth:`close` directly;
* an asyncio service (retry, DLQ) calls the same methods through :meth:`call`, which runs them
  on the loop's single dedicated thread, never on the event loop.

Subclasses override :meth:`on_assigned` / :meth:`on_revoked` to reset per-partition state; they
run inside ``consume`` on the consumer's thread, as librdkafka calls them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from confluent_kafka import Consumer, TopicPartition

__all__ = ["ConsumerLoop", "in_thread"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


async def in_thread(target: Callable[[], None], name: str) -> None:
    """Run the blocking ``target`` on a thread of its own (a consumer loop must not hold one of the
    event loop's executor threads for its whole life); return or raise as it does."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def main() -> None:
        error: BaseException | None = None
        try:
            target()
        except BaseException as exc:  # handed to the awaiting coroutine, which raises it
            error = exc
        loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=main, name=name, daemon=False).start()
    await done


class ConsumerLoop:
    """One confluent-kafka consumer, its subscription to ``topics`` and its assignment."""

    def __init__(self, config: dict[str, Any], topics: Sequence[str]) -> None:
        self.config = dict(config)
        self.topics = list(topics)
        self.consumer: Consumer | None = None
        #: ``(topic, partition)`` pairs currently assigned to this consumer.
        self.assigned: set[tuple[str, int]] = set()
        self._thread: ThreadPoolExecutor | None = None

    @property
    def client_id(self) -> str:
        """The consumer's ``client.id`` (names its thread and log lines)."""
        return str(self.config.get("client.id", "avcc-consumer"))

    def open(self) -> Consumer:
        """Create the consumer and subscribe; partitions arrive with a later ``consume``."""
        consumer = self.consumer = Consumer(self.config)
        consumer.subscribe(self.topics, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lose)
        log.info("%s consuming %s as %s", self.client_id, self.topics, self.config.get("group.id"))
        return consumer

    def close(self) -> None:
        """Leave the group and close the consumer (idempotent)."""
        consumer, self.consumer = self.consumer, None
        self.assigned.clear()
        if consumer is not None:
            consumer.close()

    async def call(self, fun: Callable[..., _T], *args: Any) -> _T:
        """Run ``fun(*args)`` on this loop's own thread (for asyncio users of the consumer)."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=self.client_id)
        return await asyncio.get_running_loop().run_in_executor(self._thread, fun, *args)

    def shutdown_thread(self) -> None:
        """Stop the dedicated thread of :meth:`call` once the consumer is closed."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=True)

    def on_assigned(self, partitions: list[TopicPartition]) -> None:
        """Hook: ``partitions`` were just assigned (already in :attr:`assigned`)."""

    def on_revoked(self, partitions: list[TopicPartition], lost: bool) -> None:
        """Hook: ``partitions`` were revoked (``lost``: taken without a clean revoke)."""

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned.update((tp.topic, tp.partition) for tp in partitions)
        self.on_assigned(partitions)

    def _revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned.difference_update((tp.topic, tp.partition) for tp in partitions)
        self.on_revoked(partitions, lost=False)

    def _lose(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned.difference_update((tp.topic, tp.partition) for tp in partitions)
        self.on_revoked(partitions, lost=True)
