"""Per input partition, the next offset a core group processes: the one check every message passes.

A core group owns its offsets (:mod:`app.platform.faust.batches`), so it never trusts where a
fetch happens to be. For each partition it keeps the next offset it expects:

* learned when the partition first delivers something: the group's committed offset, else the
  partition's first offset (retention may have deleted the start);
* a message below it was processed already (a redelivery after a seek or a rebalance): dropped;
* a message past it means the fetch skipped offsets (a message faust dropped at a rebalance, a
  position a previous generation left ahead): it and the rest of its partition in the batch are
  dropped and the partition is sought back to the expected offset; only offsets retention
  already deleted are jumped over (logged as lost);
* a partition whose high watermark stays past the expected offset while nothing arrives (its
  last message lost on the way) is sought back too, by :meth:`Cursors.watch_tails`.

Every decision that is not "next in line" is logged and counted
(``avcc_consumer_offset_decisions_total``), never taken silently.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from faust.types import TP

from app.platform.metrics import OFFSET_DECISIONS

__all__ = ["TAIL_RESEEK_S", "Cursors", "OffsetSource"]

log = logging.getLogger(__name__)

#: How long a partition's high watermark may stay past its expected offset with nothing
#: arriving before the partition is fetched again from that offset.
TAIL_RESEEK_S: Final = 10.0


class OffsetSource(Protocol):
    """What the cursors ask the consumer (faust's, through its public API and
    :mod:`app.platform.faust.internals`)."""

    def assigned(self) -> set[TP]:
        """Partitions assigned to this worker now."""

    async def starts(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Where processing of each partition starts: its committed offset, else its first."""

    async def earliest(self, tp: TP) -> int:
        """The first offset ``tp`` still holds (retention deletes the oldest)."""

    async def seek(self, tp: TP, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next."""

    def highwater(self, tp: TP) -> int | None:
        """The partition's end as of the last fetch (``None``: unknown)."""


@dataclass(slots=True)
class Cursors:
    """The next expected offset of each partition of one agent's input topics."""

    name: str
    topics: frozenset[str]
    source: OffsetSource
    clock: Callable[[], float] = time.monotonic
    _next: dict[TP, int] = field(default_factory=dict)
    _stuck_since: dict[TP, tuple[int, float]] = field(default_factory=dict)

    def next_offset(self, tp: TP) -> int | None:
        """The offset ``tp`` delivers next (``None``: not learned yet)."""
        return self._next.get(tp)

    def positions(self) -> dict[TP, int]:
        """Every learned next offset (what a commit of everything processed names)."""
        return dict(self._next)

    def forget(self, tps: Iterable[TP]) -> None:
        """Forget ``tps`` (revoked, or a batch given up): learned again from the committed offset."""
        for tp in tps:
            self._next.pop(tp, None)
            self._stuck_since.pop(tp, None)

    def _decide(self, decision: str, tp: TP, count: int = 1) -> None:
        OFFSET_DECISIONS.labels(self.name, tp.topic, decision).inc(count)

    async def admit(self, events: Sequence[Any]) -> list[Any]:
        """The events of ``events`` that are next in line for their partition, in order; the
        cursors move past them. Partitions that jumped are sought back (see the module doc)."""
        assigned = self.source.assigned()
        unknown = {
            e.message.tp for e in events if e.message.tp not in self._next and e.message.tp in assigned
        }
        if unknown:
            for tp, start in (await self.source.starts(unknown)).items():
                if tp in self.source.assigned():
                    self._next.setdefault(tp, start)
        kept: list[Any] = []
        jumped: dict[TP, int] = {}
        for event in events:
            message = event.message
            tp, offset = message.tp, message.offset
            if tp in jumped:
                continue
            expected = self._next.get(tp)
            if expected is None or tp not in assigned:
                self._decide("not_assigned", tp)
                continue
            if offset < expected:
                self._decide("redelivered", tp)
                continue
            if offset > expected:
                expected = await self._past_retention(tp, expected)
                if offset > expected:
                    jumped[tp] = offset
                    continue
            kept.append(event)
            self._next[tp] = offset + 1
        for tp, offset in jumped.items():
            expected = self._next[tp]
            log.warning(
                "%s: %s[%d] fetched offset %d where %d is next: fetching again from %d",
                self.name,
                tp.topic,
                tp.partition,
                offset,
                expected,
                expected,
            )
            self._decide("sought_back", tp)
            await self._seek(tp, expected)
        return kept

    async def _past_retention(self, tp: TP, expected: int) -> int:
        """``expected``, or the partition's first offset when retention deleted the offsets
        from ``expected`` on (they can never be processed: logged as lost)."""
        earliest = await self.source.earliest(tp)
        if earliest <= expected:
            return expected
        log.error(
            "%s: %s[%d] offsets %d..%d were deleted by retention before being processed",
            self.name,
            tp.topic,
            tp.partition,
            expected,
            earliest - 1,
        )
        self._decide("lost_to_retention", tp, earliest - expected)
        self._next[tp] = earliest
        return earliest

    async def _seek(self, tp: TP, offset: int) -> None:
        try:
            await self.source.seek(tp, offset)
        except Exception as exc:  # a leader moving: the tail watch asks again
            log.warning("%s: %s[%d] not sought to %d (%s)", self.name, tp.topic, tp.partition, offset, exc)

    async def watch_tails(self) -> None:
        """Seek back every assigned partition whose end stayed past its expected offset for
        :data:`TAIL_RESEEK_S` without a message arriving; learn the start of assigned
        partitions that never delivered anything, so a first message lost is noticed too."""
        assigned = {tp for tp in self.source.assigned() if tp.topic in self.topics}
        unknown = assigned - set(self._next)
        if unknown:
            for tp, start in (await self.source.starts(unknown)).items():
                if tp in self.source.assigned():
                    self._next.setdefault(tp, start)
        now = self.clock()
        for tp in assigned:
            expected = self._next.get(tp)
            highwater = self.source.highwater(tp)
            if expected is None or highwater is None or highwater <= expected:
                self._stuck_since.pop(tp, None)
                continue
            since = self._stuck_since.get(tp)
            if since is None or since[0] != expected:
                self._stuck_since[tp] = (expected, now)
            elif now - since[1] >= TAIL_RESEEK_S:
                self._stuck_since[tp] = (expected, now)
                log.warning(
                    "%s: %s[%d] ends at %d but nothing past %d arrived for %.0f s: fetching again from %d",
                    self.name,
                    tp.topic,
                    tp.partition,
                    highwater,
                    expected,
                    TAIL_RESEEK_S,
                    expected,
                )
                self._decide("tail_sought", tp)
                await self._seek(tp, expected)
