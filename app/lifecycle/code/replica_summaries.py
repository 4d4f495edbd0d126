"""Summaries over every record partition, answered the same by any code replica: the record
counts by status and the time to code of the last hour.

Each replica keeps the counts of the record partitions it holds in memory
(:class:`~app.lifecycle.code.status_counts.StatusCounts`), rebuilt from its table after every
rebalance, soon after the assignment (:meth:`ReplicaSummaries.keep_counts`, a timer) rather than
when first asked. A summary is this replica's part plus the part every other replica holding
record partitions answers to the request forwarded to it (a ``merge`` fan-out of
:class:`~app.platform.http.routing.OwnerRouting`); a replica that does not answer is named with
the partitions it held, so the summary says what it is missing instead of failing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import orjson
from aiohttp import web

from app.lifecycle.code.status_counts import ReplicaCounts, StatusCounts, merge_replicas
from app.lifecycle.code.time_to_code import ReplicaTimes, TimeToCodeWindow, merge_times
from app.platform.faust.tables import ModelTable
from app.platform.http.responses import json_response
from app.platform.http.routing import (
    SETTLE_WAIT_S,
    OwnerRouting,
    partitions_settled,
    rebalancing_answer,
)
from app.platform.topics import APPLY_CREATED

__all__ = ["COUNTS_PEER_TIMEOUT_S", "ReplicaSummaries"]

#: A replica's entry in a summary (its counts, its time to code).
Replica = TypeVar("Replica")

#: How long the answering replica waits for each other replica's part: below the console's own
#: time limit (``AVCC_CONSOLE_PEER_TIMEOUT_S``, 5 s), so a silent replica is named on the page
#: instead of failing the whole answer.
COUNTS_PEER_TIMEOUT_S: Final = 3.0


def _silent_counts(url: str, partitions: tuple[int, ...], error: str) -> ReplicaCounts:
    return ReplicaCounts(url, partitions, error=error)


def _silent_times(url: str, partitions: tuple[int, ...], error: str) -> ReplicaTimes:
    return ReplicaTimes(url, partitions, error=error)


def _error_of(answer: web.Response) -> str:
    """``answered STATUS[: error]`` of a peer's answer that is not a 200."""
    try:
        reason = orjson.loads(answer.body or b"{}").get("error", "")  # type: ignore[arg-type]
    except (orjson.JSONDecodeError, TypeError, AttributeError):
        reason = ""
    return f"answered {answer.status}" + (f": {reason}" if reason else "")


class ReplicaSummaries:
    """The counts and times of this replica's record partitions, and their summaries over every
    replica (see the module docstring)."""

    def __init__(
        self,
        records: ModelTable[Any],
        counts: StatusCounts,
        times: TimeToCodeWindow,
        routing: OwnerRouting,
    ) -> None:
        self.records = records
        self.counts = counts
        self.times = times
        self.routing = routing
        self.app = routing.app

    def held_partitions(self) -> list[int]:
        """The record partitions this worker holds (its active partitions of the changelog)."""
        changelog = self.records.changelog
        return sorted(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == changelog)

    def partitions_moved(self) -> None:
        """A rebalance: the counts wait for the next rebuild."""
        self.counts.invalidate()

    async def counts_built(self) -> bool:
        """Rebuild the counts if a rebalance left them unbuilt and the table partitions are
        recovered; whether they are built."""
        if self.counts.ready:
            return True
        if not partitions_settled(self.app):
            return False
        return await self.counts.rebuild(self.held_partitions(), self.records.table.items)

    async def keep_counts(self) -> None:
        """Rebuild the counts soon after each assignment, before anyone asks (a timer's body)."""
        await self.counts_built()

    async def counts_here(self) -> ReplicaCounts | None:
        """This worker's counts (waiting at most :data:`SETTLE_WAIT_S` for a rebuild)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_WAIT_S
        while not await self.counts_built():
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(0.1)
        snapshot = self.counts.snapshot()
        if snapshot is None:
            return None
        partitions, counts = snapshot
        return ReplicaCounts(str(self.app.conf.canonical_url).rstrip("/"), partitions, counts)

    def times_of(self, counts: ReplicaCounts) -> ReplicaTimes:
        """This worker's time to code of the last hour and its oldest need_human wait."""
        return ReplicaTimes(
            counts.url, counts.partitions, self.times.snapshot(), self.counts.oldest_waiting_ms()
        )

    async def record_counts(self, request: web.Request) -> web.Response:
        """``GET /v1/avcc/record-counts``: records by status of every record partition."""
        return await self._summary(
            request, lambda counts: counts, ReplicaCounts.from_json, _silent_counts, merge_replicas
        )

    async def time_to_code(self, request: web.Request) -> web.Response:
        """``GET /v1/avcc/time-to-code``: time to code and the oldest need_human wait."""
        return await self._summary(request, self.times_of, ReplicaTimes.from_json, _silent_times, merge_times)

    async def _summary(
        self,
        request: web.Request,
        mine: Callable[[ReplicaCounts], Replica],
        entry: Callable[[Mapping[str, Any]], Replica],
        silent: Callable[[str, tuple[int, ...], str], Replica],
        merge: Callable[[list[Replica], int], dict[str, Any]],
    ) -> web.Response:
        """``mine`` (this worker's part, from its counts) and the ``replicas`` entries every other
        replica holding record partitions answers to the request forwarded (``entry`` reads one;
        ``silent(url, partitions, why)`` stands for one that does not answer), ``merge``d."""
        forwarded = await self.routing.table_wide_request(request, scope="records:read")
        if isinstance(forwarded, web.Response):
            return forwarded
        here = await self.counts_here()
        if here is None:
            return rebalancing_answer("record counts are being rebuilt after a rebalance")
        replicas = [mine(here)]
        if not forwarded:
            peers = await self.routing.fan_out(request, "merge", timeout_s=COUNTS_PEER_TIMEOUT_S)
            for peer in peers.answers:
                if peer.answer.status == 200:
                    replicas.extend(entry(e) for e in orjson.loads(peer.body)["replicas"])
                else:
                    replicas.append(silent(peer.url, peer.partitions, _error_of(peer.answer)))
        return json_response(merge(replicas, APPLY_CREATED.partitions))
