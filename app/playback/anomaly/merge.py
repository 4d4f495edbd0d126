"""Stage 2 of the anomaly detector: merge every source partition's partials, evaluate each window once.

The detector keeps one :class:`MergeState` per owned partition (bucket) of the partials topic
(:mod:`~app.playback.anomaly.partials`) in a :class:`Merger`. Each record adds one source
partition's share of its closed windows; a window is *complete* once every source partition's
closed bound (its *mark*) has passed it, and is then evaluated exactly once with the rules
(:func:`~app.playback.anomaly.rules.evaluate_window`) against the bucket's baseline, folded into
that baseline and forgotten -- oldest first. Since a code's counts from every source partition
meet here, the findings are the same with 1, 2 or 24 workers.

Duplicates: a record whose ``until`` is not past its source's mark is a replay (stage 1 resumed
from an older snapshot after a crash) and is skipped; windows before the mark in a record that
advances it are skipped too, so each (source partition, window) is merged at most once.
Pure: the caller does the I/O (producing findings, snapshots, metrics).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from app.playback.anomaly.baselines import Baseline, update_baseline
from app.playback.anomaly.partials import Partial
from app.playback.anomaly.rules import Finding, WindowAgg, evaluate_window
from app.playback.anomaly.settings import AnomalyRuleSettings

__all__ = ["MERGE_SNAPSHOT_VERSION", "ClosedWindow", "MergeState", "Merger"]

log = logging.getLogger(__name__)

MERGE_SNAPSHOT_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class ClosedWindow:
    """One window of one bucket evaluated over every source partition."""

    start: int
    end: int
    #: Events of the window, all source partitions (all codes, not only the bucket's).
    events: int
    #: Source partitions that had events in the window, ascending.
    partitions: list[int]
    findings: list[Finding]


@dataclass(slots=True)
class MergeState:
    """Stage-2 state of one partials partition (what its snapshot holds, see :mod:`tables.anomaly`)."""

    partition: int
    #: Next offset of the partials partition to consume (``None``: nothing consumed yet).
    offset: int | None = None
    #: Source partition -> windows before this are merged (its closed bound, epoch ms).
    marks: dict[int, int] = field(default_factory=dict)
    #: Window start -> the merged partials received so far.
    windows: dict[int, WindowAgg] = field(default_factory=dict)
    #: Window start -> source partitions that had events in it.
    sources: dict[int, list[int]] = field(default_factory=dict)
    baseline: Baseline = field(default_factory=Baseline)
    #: Changed since the last snapshot.
    dirty: bool = False

    def to_bytes(self, max_pairs: int) -> bytes:
        """The snapshot (JSON)."""
        return orjson.dumps(
            {
                "v": MERGE_SNAPSHOT_VERSION,
                "partition": self.partition,
                "offset": self.offset,
                "marks": {str(p): m for p, m in self.marks.items()},
                "windows": {str(start): agg.to_json(max_pairs) for start, agg in self.windows.items()},
                "sources": {str(start): parts for start, parts in self.sources.items()},
                "baseline": self.baseline.to_json(),
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> MergeState:
        """Inverse of :meth:`to_bytes` (``ValueError`` for an unknown snapshot version)."""
        data: Mapping[str, Any] = orjson.loads(raw)
        if data.get("v") != MERGE_SNAPSHOT_VERSION:
            raise ValueError(f"unknown anomaly merge snapshot version {data.get('v')!r}")
        offset = data.get("offset")
        return cls(
            partition=int(data["partition"]),
            offset=int(offset) if offset is not None else None,
            marks={int(p): int(m) for p, m in data.get("marks", {}).items()},
            windows={int(k): WindowAgg.from_json(v) for k, v in data.get("windows", {}).items()},
            sources={int(k): [int(p) for p in v] for k, v in data.get("sources", {}).items()},
            baseline=Baseline.from_json(data.get("baseline", {})),
        )

    def complete_until(self, sources: int) -> int:
        """Windows starting before this have every source partition's share (epoch ms; 0: none)."""
        if len(self.marks) < sources:
            return 0
        return min(self.marks.values())


class Merger:
    """The stage-2 states of the partials partitions a detector owns."""

    def __init__(self, rules: AnomalyRuleSettings, *, sources: int) -> None:
        self.rules = rules
        #: Partition count of the source topic: the marks a window needs to be complete.
        self.sources = sources
        self.states: dict[int, MergeState] = {}

    def adopt(self, states: Mapping[int, MergeState]) -> None:
        """Own these (restored or fresh) states."""
        self.states.update(states)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop the state of partitions this detector no longer owns."""
        for partition in partitions:
            self.states.pop(partition, None)

    def add(self, partition: int, offset: int, partial: Partial | None) -> bool:
        """Merge one record of ``partition`` (``None``: undecodable); ``False`` if it was skipped."""
        state = self.states.get(partition)
        if state is None:
            return False
        state.offset = offset + 1
        state.dirty = True
        if partial is None or not 0 <= partial.source < self.sources:
            return False
        mark = state.marks.get(partial.source, 0)
        if partial.until <= mark:
            return False
        for start, agg in partial.windows.items():
            if start < mark:
                continue
            merged = state.windows.get(start)
            if merged is None:
                state.windows[start] = merged = WindowAgg()
            merged.merge(agg)
            if agg.events:
                state.sources.setdefault(start, []).append(partial.source)
        state.marks[partial.source] = partial.until
        return True

    def close(self) -> list[ClosedWindow]:
        """Evaluate, fold into the baseline and forget every complete window, oldest first."""
        rules = self.rules
        closed: list[ClosedWindow] = []
        for state in self.states.values():
            until = state.complete_until(self.sources)
            for start in sorted(s for s in state.windows if s < until):
                agg = state.windows.pop(start)
                partitions = sorted(state.sources.pop(start, []))
                findings = evaluate_window(agg, state.baseline, rules)
                update_baseline(state.baseline, agg, start, rules)
                state.dirty = True
                closed.append(ClosedWindow(start, start + rules.window_ms, agg.events, partitions, findings))
                log.debug(
                    "bucket %d window %d: %d events from %d partitions, %d findings",
                    state.partition,
                    start,
                    agg.events,
                    len(partitions),
                    len(findings),
                )
        return closed

    def open_windows(self) -> int:
        """Windows waiting for a source partition's share, summed over the owned buckets."""
        return sum(len(s.windows) for s in self.states.values())
