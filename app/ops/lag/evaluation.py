"""Burrow-style lag status of a partition and the seed's lag rules (9.3.4): pure functions of a history.

Status per partition (and per group/topic = the worst of its partitions)::

    OK     lag is 0, or the consumer is moving and lag is not steadily growing
    WARN   committed offset moves but lag grew at every sample across the whole window
    STALL  lag > 0, committed offset frozen for the whole window, group has live members
    STOP   lag > 0 and the group has no members, or nothing was committed for the whole window
           while nobody (known) is alive to commit
    ERR    the offsets of the group could not be read

A rule fires for a (group, topic) while the total lag is above its ``max_lag``, or while the lag
has been > 0 and has not shrunk (least-squares slope >= 0) for its ``not_shrinking_s``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from app.ops.lag.settings import LagRule
from app.platform.lag.snapshot import GroupState, PartitionOffsets

__all__ = [
    "STATUS_COLOURS",
    "STATUS_ORDER",
    "PartitionStatus",
    "RuleState",
    "Sample",
    "Status",
    "TopicStatus",
    "evaluate_rule",
    "least_squares_slope",
    "partition_status",
    "samples_within",
]

Status = Literal["OK", "WARN", "STALL", "STOP", "ERR"]
#: Severity order of the statuses (a group/topic takes the worst status of its partitions).
STATUS_ORDER: dict[Status, int] = {"OK": 0, "WARN": 1, "STALL": 2, "STOP": 3, "ERR": 4}


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """Status of one partition of a group at the report's time."""

    offsets: PartitionOffsets
    status: Status
    reason: str


@dataclass(frozen=True, slots=True)
class TopicStatus:
    """Status of a group on a topic: the worst partition's status, total lag."""

    group: str
    topic: str
    status: Status
    reason: str
    lag: int
    partitions: tuple[PartitionStatus, ...]


@dataclass(frozen=True, slots=True)
class RuleState:
    """Whether ``rule`` fires for ``group``/``topic`` now, and why."""

    rule: LagRule
    group: str
    topic: str
    firing: bool
    lag: int
    reason: str


@dataclass(frozen=True, slots=True)
class Sample:
    """One partition (or group/topic total) observation: when, committed offset, lag."""

    at: float
    committed: int | None
    lag: int


def samples_within(samples: Sequence[Sample], now: float, span: float) -> tuple[list[Sample], bool]:
    """Samples within ``[now - span, now]`` plus the latest one before (the anchor).

    The flag says whether the history covers the whole span (an anchor exists).
    """
    start = now - span
    anchor: Sample | None = None
    inside: list[Sample] = []
    for sample in samples:
        if sample.at <= start:
            anchor = sample
        else:
            inside.append(sample)
    if anchor is None:
        return inside, False
    return [anchor, *inside], True


def partition_status(
    samples: Sequence[Sample], now: float, window_s: float, group: GroupState | None
) -> tuple[Status, str]:
    """Burrow-style status of one partition from its samples (oldest first, last = now)."""
    if not samples:
        return "OK", "no data"
    current = samples[-1]
    if current.lag == 0:
        return "OK", "no lag"
    alive = group.alive if group is not None else None
    if alive is False:
        return "STOP", f"lag {current.lag} and the group has no members"
    window, covered = samples_within(samples, now, window_s)
    if not covered:
        return "OK", f"lag {current.lag} (history shorter than the {window_s:g}s window)"
    committed = {s.committed for s in window}
    frozen = len(committed) == 1
    if frozen:
        if next(iter(committed)) is None and alive is not True:
            return "STOP", f"lag {current.lag} and nothing committed for {window_s:g}s"
        if alive is True:
            return "STALL", f"lag {current.lag}, committed offset frozen for {window_s:g}s with live members"
        return "STOP", f"lag {current.lag}, no commit for {window_s:g}s"
    lags = [s.lag for s in window]
    if len(lags) >= 3 and lags[-1] > lags[0] and all(b >= a for a, b in itertools.pairwise(lags)):
        return "WARN", f"lag grew from {lags[0]} to {lags[-1]} over {window_s:g}s"
    return "OK", f"lag {current.lag}, consumer moving"


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope (what PromQL ``deriv`` computes)."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var


def evaluate_rule(
    rule: LagRule, group: str, totals: Sequence[tuple[float, int]], now: float, present: bool
) -> RuleState:
    """Whether ``rule`` fires for ``group`` given the history of its total lag on the topic."""
    topic = rule.topic
    if not present or not totals:
        return RuleState(rule, group, topic, False, 0, "topic not found")
    lag = totals[-1][1]
    if rule.max_lag is not None and lag > rule.max_lag:
        return RuleState(rule, group, topic, True, lag, f"lag {lag} > {rule.max_lag}")
    if rule.not_shrinking_s is not None and lag >= max(1, rule.not_shrinking_min_lag):
        samples = [Sample(t, None, v) for t, v in totals]
        window, covered = samples_within(samples, now, rule.not_shrinking_s)
        if covered and all(s.lag >= max(1, rule.not_shrinking_min_lag) for s in window):
            slope = least_squares_slope([(s.at, float(s.lag)) for s in window])
            if slope >= 0:
                return RuleState(
                    rule,
                    group,
                    topic,
                    True,
                    lag,
                    f"lag {lag} > 0 and not shrinking for {rule.not_shrinking_s:g}s",
                )
    return RuleState(rule, group, topic, False, lag, f"lag {lag}")


#: Colour of each status on the console pages.
STATUS_COLOURS: dict[Status, str] = {
    "OK": "#1a7f37",
    "WARN": "#b08800",
    "STALL": "#d1242f",
    "STOP": "#8250df",
    "ERR": "#57606a",
}
