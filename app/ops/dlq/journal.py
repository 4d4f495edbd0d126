"""Where the DLQ store commits operator changes: the shared state topic, or (one process) locally.

:class:`KafkaJournal` is what an ops worker uses: a change is produced with the core profile
(acks=all, idempotent) to its event key's partition of ``topic.system.dlq.state``, then the
journal waits until this replica's own state consumer has applied that offset and reports whether
the change won (:func:`app.ops.dlq.state.apply_change`). Only then is the operator answered, so
an acknowledged action is in Kafka and in this replica's view. Before computing a change the store
calls :meth:`Journal.sync`, which waits until the partition's end offset is applied: a replica
acts on the newest state it can see, and the version check settles the rest.

:class:`LocalJournal` applies changes straight to the store: a single process with no broker
(unit tests, tooling over a copied store).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from app.ops.dlq.entries import DlqError
from app.ops.dlq.state import StateChange, state_partition

if TYPE_CHECKING:
    from app.ops.dlq.reinject import Sender
    from app.ops.dlq.store import DlqStore

__all__ = ["Journal", "KafkaJournal", "LocalJournal", "StateNotCaughtUp"]


class StateNotCaughtUp(DlqError):
    """This replica has not read the shared state far enough yet (starting, broker slow): try again."""


class Journal(Protocol):
    """How the store makes a change durable and learns whether it won."""

    async def sync(self, event_key: str) -> None:
        """Return once every change of ``event_key`` committed so far is in the store."""

    async def commit(self, change: StateChange) -> bool:
        """Make ``change`` durable; True if it was accepted, False if a concurrent change won."""


class LocalJournal:
    """Applies changes directly to one store (no other replica exists)."""

    def __init__(self, store: DlqStore) -> None:
        self.store = store

    async def sync(self, event_key: str) -> None:
        """Nothing to wait for: every change is applied when committed."""

    async def commit(self, change: StateChange) -> bool:
        """Apply ``change`` now."""
        return self.store.apply(change)


class KafkaJournal:
    """Commits through the state topic and waits for this replica's consumer to apply it."""

    def __init__(
        self,
        store: DlqStore,
        sender: Sender,
        topic: str,
        partitions: int,
        end_offset: Callable[[int], Awaitable[int]],
        *,
        timeout_s: float = 30.0,
    ) -> None:
        self.store = store
        self.sender = sender
        self.topic = topic
        self.partitions = partitions
        self.end_offset = end_offset
        self.timeout_s = timeout_s

    async def sync(self, event_key: str) -> None:
        """Wait until this replica applied the partition of ``event_key`` up to its end offset."""
        partition = state_partition(event_key, self.partitions)
        await self._applied(partition, await self.end_offset(partition))

    async def commit(self, change: StateChange) -> bool:
        """Produce ``change`` to its partition, wait until it is applied here, return its outcome."""
        partition = state_partition(change.event_key, self.partitions)
        delivery = await self.sender.send(
            self.topic, change.to_json(), change.event_key.encode(), None, partition
        )
        await self._applied(partition, delivery.offset + 1)
        outcome = self.store.outcome(change.change_id)
        if outcome is None:
            raise DlqError(f"change {change.change_id} was applied but its outcome is unknown")
        return outcome

    async def _applied(self, partition: int, next_offset: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while self.store.state_offsets().get(partition, 0) < next_offset:
            if time.monotonic() > deadline:
                raise StateNotCaughtUp(
                    f"the shared DLQ state ({self.topic}[{partition}]) is not read up to offset "
                    f"{next_offset} yet; try again"
                )
            await asyncio.sleep(0.02)
