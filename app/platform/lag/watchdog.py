"""Stall watchdog: a worker whose consumer stopped making progress exits so it is restarted.

Seen after an Apache Kafka restart: a faust worker's consumer lost its group session, found
the coordinator again and then never rejoined or fetched; the event loop stayed idle and the
worker looked healthy while its partitions' lag sat still. Also seen: a table recovery that
never received an event of the changelog partitions it waited for (faust logged "No event
received for active tp" for minutes; a second rebalance had come 3 s after the first), so the
worker never became ready again and its partitions had no consumer. Every effect in this
pipeline is safe to replay, so the cure is a crash: the supervisor (the dev stack, Kubernetes)
restarts it, and a fresh recovery reads the changelogs again.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.platform.lag.snapshot import PartitionOffsets

__all__ = [
    "RecoveryWatch",
    "StallWatchdog",
    "exit_recovery_stalled",
    "exit_stalled",
    "task_stacks",
]

log = logging.getLogger(__name__)

#: Exit status of a worker that stopped itself because its consumer stalled (EX_SOFTWARE).
STALL_EXIT_CODE = 70


@dataclass(slots=True)
class StallWatchdog:
    """Tracks, per partition with lag, when its committed offset last moved."""

    stall_s: float
    _since: dict[tuple[str, int], tuple[int | None, float]] = field(default_factory=dict)

    def observe(self, rows: Iterable[PartitionOffsets], now: float) -> list[tuple[str, int]]:
        """Record one lag reading; the partitions stalled for ``stall_s`` (lag > 0, committed
        offset unchanged). A partition without lag is never stalled."""
        stalled: list[tuple[str, int]] = []
        seen: set[tuple[str, int]] = set()
        for row in rows:
            key = (row.topic, row.partition)
            seen.add(key)
            previous = self._since.get(key)
            if row.lag <= 0 or previous is None or previous[0] != row.committed:
                self._since[key] = (row.committed, now)
                continue
            if now - previous[1] >= self.stall_s:
                stalled.append(key)
        for key in set(self._since) - seen:
            del self._since[key]
        return stalled


@dataclass(slots=True)
class RecoveryWatch:
    """Tracks since when a table recovery has been waiting without reading anything."""

    stall_s: float
    _since: tuple[int, float] | None = None

    def observe(self, remaining: int | None, now: float) -> bool:
        """Record one reading: ``remaining`` changelog offsets still to read (``None``: no
        recovery under way). Whether the recovery has read nothing for ``stall_s``."""
        if not remaining:
            self._since = None
            return False
        if self._since is None or self._since[0] != remaining:
            self._since = (remaining, now)
            return False
        return now - self._since[1] >= self.stall_s


def _await_chain(coro: Any, frames: int) -> list[str]:
    """``file:line function`` of each coroutine ``coro`` awaits, outermost first."""
    chain: list[str] = []
    while coro is not None and len(chain) < frames:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return chain


def task_stacks(frames: int = 12) -> str:
    """Where every task of the running event loop waits, following each await down to the
    innermost coroutine (empty outside a loop): what a stalled worker was stuck on."""
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:
        return ""
    out = io.StringIO()
    for task in tasks:
        out.write(f"task {task.get_name()}:\n")
        for line in _await_chain(task.get_coro(), frames):
            out.write(f"  {line}\n")
    return out.getvalue()


def exit_stalled(
    group: str,
    stalled: list[tuple[str, int]],
    stall_s: float,
    offsets: Iterable[PartitionOffsets] = (),
    consumer: str = "",
) -> None:
    """Log why (the stalled partitions' offsets, the ``consumer``'s own view of them -- the next
    offsets its agents expect --, every task's awaits) and exit at once (no graceful shutdown:
    the stuck consumer may hang it)."""
    wanted = set(stalled)
    rows = "; ".join(
        f"{r.topic}[{r.partition}] committed={r.committed} lag={r.lag}"
        for r in offsets
        if (r.topic, r.partition) in wanted
    )
    log.critical(
        "consumer of group %s made no progress for %.0f s on %s while they have lag; exiting with "
        "status %d so the supervisor restarts this worker (%s) %s\n%s",
        group,
        stall_s,
        ", ".join(f"{t}[{p}]" for t, p in stalled),
        STALL_EXIT_CODE,
        rows,
        consumer,
        task_stacks(),
    )
    logging.shutdown()
    os._exit(STALL_EXIT_CODE)


def exit_recovery_stalled(group: str, remaining: int, stall_s: float) -> None:
    """Log the stuck recovery (and every task's awaits) and exit at once, like :func:`exit_stalled`."""
    log.critical(
        "table recovery of group %s read nothing for %.0f s with %d changelog offsets still to "
        "read; exiting with status %d so the supervisor restarts this worker\n%s",
        group,
        stall_s,
        remaining,
        STALL_EXIT_CODE,
        task_stacks(),
    )
    logging.shutdown()
    os._exit(STALL_EXIT_CODE)
