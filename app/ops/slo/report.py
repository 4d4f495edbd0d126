"""Each level's service over the code group's last hour (``GET /v1/avcc/time-to-code``), for the
console: p50 and p99 of its time to code, the share answered in time, the error budget left.

A level's numbers count, like its objective, the records no person decided; quantiles are read
off the histogram's buckets the way Prometheus's ``histogram_quantile`` reads them, so the console
and a dashboard over the same buckets show the same figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.ops.slo.settings import GOOD_OUTCOMES, LevelObjective
from app.platform.metrics import REVIEW_AI

__all__ = ["LevelReport", "histogram_quantile", "level_reports"]


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The ``q``-quantile of a histogram (``cumulative`` counts within each of ``bounds``, then in
    all), interpolated within its bucket as Prometheus does; ``None`` without observations."""
    observations = cumulative[-1]
    if observations == 0:
        return None
    rank = q * observations
    at = next((i for i, count in enumerate(cumulative[:-1]) if count >= rank), len(bounds))
    if at == len(bounds):
        return bounds[-1]
    if at == 0 and bounds[0] <= 0:
        return bounds[0]
    start, below = (bounds[at - 1], cumulative[at - 1]) if at > 0 else (0.0, 0.0)
    return start + (bounds[at] - start) * ((rank - below) / (cumulative[at] - below))


@dataclass(frozen=True, slots=True)
class LevelReport:
    """One level over the window: how many answered, how fast, and how that meets its objective."""

    objective: LevelObjective
    answered: int
    in_time: int
    p50_s: float | None
    p99_s: float | None
    #: ``(stage, mean seconds)`` of the stage the level's records spent the most time in (the
    #: wait for a person aside), ``None`` when no stage was observed.
    slowest_stage: tuple[str, float] | None

    @property
    def compliance(self) -> float | None:
        """The share answered in time (``None``: nothing answered)."""
        return self.in_time / self.answered if self.answered else None

    @property
    def budget_left(self) -> float | None:
        """The share of the window's error budget not spent (below 0: overspent)."""
        if not self.answered:
            return None
        allowed = self.objective.budget * self.answered
        return 1 - (self.answered - self.in_time) / allowed


def _add(total: list[float], counts: Sequence[Any]) -> list[float]:
    return [a + float(b) for a, b in zip(total or [0.0] * len(counts), counts, strict=True)]


def level_reports(window: Mapping[str, Any], objectives: Sequence[LevelObjective]) -> list[LevelReport]:
    """One report per objective from the route's answer."""
    bounds = [float(b) for b in window["bounds"]]
    reports = []
    for objective in objectives:
        chosen = [s for s in window["series"] if s["level"] == objective.level and s["review"] == REVIEW_AI]
        cumulative: list[float] = []
        for series in chosen:
            cumulative = _add(cumulative, series["buckets"])
        target = bounds.index(objective.target_s)
        in_time = sum(int(s["buckets"][target]) for s in chosen if s["outcome"] in GOOD_OUTCOMES)
        stages = [
            (str(s["stage"]), float(s["sum"]) / int(s["count"]))
            for s in window["stages"]
            if s["level"] == objective.level and s["stage"] != "human_wait" and int(s["count"])
        ]
        reports.append(
            LevelReport(
                objective=objective,
                answered=int(cumulative[-1]) if cumulative else 0,
                in_time=in_time,
                p50_s=histogram_quantile(0.5, bounds, cumulative) if cumulative else None,
                p99_s=histogram_quantile(0.99, bounds, cumulative) if cumulative else None,
                slowest_stage=max(stages, key=lambda stage: stage[1], default=None),
            )
        )
    return reports
