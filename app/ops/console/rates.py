"""Produce and consume rates from the lag monitor's offset snapshots, without scraping anything.

End offsets over time give the produce rate of a topic; committed offsets over time give the
consume rate of a group; total lag over time is each group's trend. :class:`OffsetHistory` keeps
these three series per name for ``horizon_s`` seconds (memory only: a restart starts afresh).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from app.platform.lag.snapshot import LagSnapshot

__all__ = ["OffsetHistory", "Series", "rate_series"]

#: ``(seconds since the epoch, value)`` samples, oldest first.
Series = deque[tuple[float, float]]


def rate_series(samples: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Per-second increase between consecutive samples (a counter reset counts as 0)."""
    out: list[tuple[float, float]] = []
    previous: tuple[float, float] | None = None
    for at, value in samples:
        if previous is not None and at > previous[0]:
            out.append((at, max(0.0, value - previous[1]) / (at - previous[0])))
        previous = (at, value)
    return out


class OffsetHistory:
    """Per-topic end offsets, per-group committed offsets and per-group lag, over ``horizon_s``."""

    def __init__(self, horizon_s: float = 600.0) -> None:
        self.horizon_s = horizon_s
        self.topic_ends: dict[str, Series] = {}
        self.group_commits: dict[str, Series] = {}
        self.group_lags: dict[str, Series] = {}

    def add(self, snapshot: LagSnapshot) -> None:
        """Record one snapshot (a broker-wide error adds nothing)."""
        if not snapshot.partitions:
            return
        ends: dict[tuple[str, int], int] = {}
        commits: dict[str, int] = {}
        lags: dict[str, int] = {}
        for p in snapshot.partitions:
            ends[(p.topic, p.partition)] = max(ends.get((p.topic, p.partition), 0), p.end)
            commits[p.group] = commits.get(p.group, 0) + (p.committed or 0)
            lags[p.group] = lags.get(p.group, 0) + p.lag
        per_topic: dict[str, int] = {}
        for (topic, _), end in ends.items():
            per_topic[topic] = per_topic.get(topic, 0) + end
        at = snapshot.taken_at
        stores = ((self.topic_ends, per_topic), (self.group_commits, commits), (self.group_lags, lags))
        for store, values in stores:
            for name, value in values.items():
                series = store.setdefault(name, deque())
                series.append((at, float(value)))
                while series and series[0][0] < at - self.horizon_s:
                    series.popleft()
            for gone in [n for n in store if n not in values]:
                del store[gone]

    @staticmethod
    def rate(series: Series | None, window_s: float = 60.0) -> float | None:
        """Average per-second increase over the last ``window_s`` (``None`` with under two samples)."""
        if not series or len(series) < 2:
            return None
        last_at, last = series[-1]
        first_at, first = next(((t, v) for t, v in series if t >= last_at - window_s), series[0])
        if last_at <= first_at:
            first_at, first = series[-2]
        return max(0.0, last - first) / (last_at - first_at)
