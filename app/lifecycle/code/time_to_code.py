"""Time to code: how long a record took from its application to its final answer, stage by stage.

A record is observed once, by the durable write that gives it its first final status (``issued``,
``rejected`` or ``chain_failed``: :func:`final_answer`), in the callback the batch runtime calls
once that write is in the table's changelog and the local store. A redelivered or replayed event
is a duplicate by its event id and writes nothing, and a later event of a record already final
(a second receipt, a review result it ignores) does not move it into a final status again, so no
record is observed twice.

The time is read off the record as it is at that moment: from ``created_ms`` (the application's
acceptance, its ``apply.created`` event's time) to the write's own history entry; the stages
(:data:`~app.platform.metrics.TIME_TO_CODE_STAGES`) from the first history entry of each kind.
The history may be capped, its middle entries dropped: a stage whose bounds are gone is not
observed, the total and the outcome always are.

Each answer goes to the Prometheus histograms and to :class:`TimeToCodeWindow`, the last hour in
minute slots, which ``GET /v1/avcc/time-to-code`` merges over the replicas for the console.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from app.lifecycle.code.records import HistoryEntry, RecordState
from app.platform.metrics import (
    REVIEW_AI,
    REVIEW_HUMAN,
    TIME_TO_CODE,
    TIME_TO_CODE_BUCKETS,
    TIME_TO_CODE_STAGE,
)

__all__ = [
    "FINAL_STATUSES",
    "FinalAnswer",
    "ReplicaTimes",
    "TimeToCodeWindow",
    "Window",
    "final_answer",
    "merge_times",
    "stage_seconds",
    "waiting_since",
]

#: Statuses that answer an application: its code, a refusal, a failed notarisation.
FINAL_STATUSES: Final = frozenset({"issued", "rejected", "chain_failed"})
#: The level of a record that got its final answer before its review result (a chain failure).
UNKNOWN_LEVEL: Final = "unknown"
#: How far back the window reaches, and the width of one of its slots.
WINDOW_S: Final = 3600
SLOT_S: Final = 60

_REVIEW = "review.task.finished"


@dataclass(frozen=True, slots=True)
class FinalAnswer:
    """A record's time to code, observed when it got its final answer."""

    level: str
    outcome: str
    review: str
    seconds: float
    stages: Mapping[str, float]


def _firsts(history: Iterable[HistoryEntry]) -> dict[str, int]:
    """When each kind of step first shows in the history (epoch ms): ``applied`` (its
    apply.created), ``reviewed`` (the first review result), ``waiting`` (need_human), ``decided``
    (a final review result), ``confirmed`` (the chain receipt)."""
    firsts: dict[str, int] = {}
    for entry in history:
        kinds = {
            "applied": entry.event == "apply.created",
            "reviewed": entry.event == _REVIEW,
            "waiting": entry.status == "need_human",
            "decided": entry.event == _REVIEW and entry.status not in {"submitted", "need_human"},
            "confirmed": entry.event == "chain.tx.confirmed",
        }
        for kind, matches in kinds.items():
            if matches:
                firsts.setdefault(kind, entry.at_ms)
    return firsts


def _start_ms(record: RecordState) -> int:
    if record.created_ms is not None:
        return record.created_ms
    return record.history[0].at_ms if record.history else 0


def stage_seconds(record: RecordState) -> dict[str, float]:
    """Seconds of each stage whose bounds are in the record's history (none negative: replicas'
    clocks may disagree by a little)."""
    firsts = _firsts(record.history)
    bounds = {
        "code": ("start", "applied"),
        "review": ("applied", "reviewed"),
        "human_wait": ("waiting", "decided"),
        "chain": ("decided", "confirmed"),
    }
    known = {**firsts, "start": _start_ms(record)}
    return {
        stage: max(0, known[end] - known[begin]) / 1000
        for stage, (begin, end) in bounds.items()
        if begin in known and end in known
    }


def final_answer(old_status: str | None, record: RecordState) -> FinalAnswer | None:
    """The record's time to code if the write that made it ``record`` (from ``old_status``) gave
    it its first final status; ``None`` otherwise."""
    if record.status not in FINAL_STATUSES or old_status in FINAL_STATUSES:
        return None
    end = record.updated_ms if record.updated_ms is not None else _start_ms(record)
    human = any(entry.status == "need_human" for entry in record.history)
    return FinalAnswer(
        level=record.final_level or UNKNOWN_LEVEL,
        outcome=record.status,
        review=REVIEW_HUMAN if human else REVIEW_AI,
        seconds=max(0, end - _start_ms(record)) / 1000,
        stages=stage_seconds(record),
    )


def waiting_since(record: RecordState) -> int | None:
    """Since when a ``need_human`` record has waited for a person (the first entry of the
    need_human run its history ends with); ``None`` for any other status."""
    if record.status != "need_human":
        return None
    since = record.updated_ms if record.updated_ms is not None else _start_ms(record)
    for entry in reversed(record.history):
        if entry.status != "need_human":
            break
        since = entry.at_ms
    return since


@dataclass(slots=True)
class Window:
    """Answers of a span of time: per ``(level, outcome, review)`` the count in each bucket of
    :data:`TIME_TO_CODE_BUCKETS` (``+Inf`` last) and the seconds in all; per ``(level, stage)``
    the count and the seconds."""

    series: dict[tuple[str, str, str], tuple[list[int], float]] = field(default_factory=dict)
    stages: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)

    def add(self, answer: FinalAnswer) -> None:
        """Count one answer."""
        key = (answer.level, answer.outcome, answer.review)
        counts, total = self.series.get(key) or ([0] * (len(TIME_TO_CODE_BUCKETS) + 1), 0.0)
        counts[bisect.bisect_left(TIME_TO_CODE_BUCKETS, answer.seconds)] += 1
        self.series[key] = (counts, total + answer.seconds)
        for stage, seconds in answer.stages.items():
            count, spent = self.stages.get((answer.level, stage), (0, 0.0))
            self.stages[(answer.level, stage)] = (count + 1, spent + seconds)

    def merge(self, other: Window) -> None:
        """Add ``other``'s answers to these."""
        for key, (counts, total) in other.series.items():
            mine, spent = self.series.get(key) or ([0] * len(counts), 0.0)
            self.series[key] = ([a + b for a, b in zip(mine, counts, strict=True)], spent + total)
        for stage_key, (count, seconds) in other.stages.items():
            have, spent = self.stages.get(stage_key, (0, 0.0))
            self.stages[stage_key] = (have + count, spent + seconds)

    def as_json(self) -> dict[str, Any]:
        """``series`` with cumulative buckets (as Prometheus's ``le``) and ``stages``."""
        series = []
        for (level, outcome, review), (counts, total) in sorted(self.series.items()):
            cumulative, running = [], 0
            for count in counts:
                running += count
                cumulative.append(running)
            entry = {"level": level, "outcome": outcome, "review": review, "buckets": cumulative}
            series.append({**entry, "sum": round(total, 3)})
        stages = [
            {"level": level, "stage": stage, "count": count, "sum": round(seconds, 3)}
            for (level, stage), (count, seconds) in sorted(self.stages.items())
        ]
        return {"series": series, "stages": stages}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Window:
        """The window a replica answered (:meth:`as_json`)."""
        window = cls()
        for entry in body.get("series", ()):
            cumulative = [int(c) for c in entry["buckets"]]
            counts = [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)]
            key = (str(entry["level"]), str(entry["outcome"]), str(entry["review"]))
            window.series[key] = (counts, float(entry["sum"]))
        for entry in body.get("stages", ()):
            stage = (str(entry["level"]), str(entry["stage"]))
            window.stages[stage] = (int(entry["count"]), float(entry["sum"]))
        return window


class TimeToCodeWindow:
    """Observes answers into the Prometheus histograms and keeps the last :data:`WINDOW_S` of
    them in minute slots (this worker's, from its start: a restarted worker starts empty)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._slots: dict[int, Window] = {}

    def observe(self, answer: FinalAnswer) -> None:
        """Count ``answer`` in the histograms and the current slot."""
        TIME_TO_CODE.labels(answer.level, answer.outcome, answer.review).observe(answer.seconds)
        for stage, seconds in answer.stages.items():
            TIME_TO_CODE_STAGE.labels(answer.level, stage).observe(seconds)
        slot = int(self.clock() // SLOT_S)
        self._slots.setdefault(slot, Window()).add(answer)

    def snapshot(self) -> Window:
        """The answers of the last :data:`WINDOW_S` (the current slot and the 59 before it)."""
        oldest = int(self.clock() // SLOT_S) - WINDOW_S // SLOT_S + 1
        for slot in [s for s in self._slots if s < oldest]:
            del self._slots[slot]
        total = Window()
        for window in self._slots.values():
            total.merge(window)
        return total


@dataclass(frozen=True, slots=True)
class ReplicaTimes:
    """What one code replica answered: its window, and since when the oldest ``need_human``
    record of its partitions waits (``None``: none waits), or why it did not answer."""

    url: str
    partitions: tuple[int, ...]
    window: Window | None = None
    oldest_need_human_ms: int | None = None
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The replica's entry in the route's ``replicas`` list."""
        entry: dict[str, Any] = {
            "url": self.url,
            "partitions": list(self.partitions),
            "answered": self.window is not None,
        }
        if self.window is not None:
            entry.update(self.window.as_json(), oldest_need_human_ms=self.oldest_need_human_ms)
        if self.error is not None:
            entry["error"] = self.error
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> ReplicaTimes:
        """The entry a peer answered (its window only when it ``answered``)."""
        oldest = entry.get("oldest_need_human_ms")
        return cls(
            str(entry["url"]),
            tuple(int(p) for p in entry.get("partitions", ())),
            Window.from_json(entry) if entry.get("answered") else None,
            int(oldest) if oldest is not None else None,
            entry.get("error"),
        )


def merge_times(replicas: Iterable[ReplicaTimes], partitions: int) -> dict[str, Any]:
    """The route's body: the windows of the replicas that answered added up, the oldest
    ``need_human`` wait among their partitions, every replica with its partitions, and the
    partitions whose waits nobody reported."""
    total = Window()
    counted: set[int] = set()
    waits: list[int] = []
    listed = sorted(replicas, key=lambda r: (r.partitions[:1] or (partitions,), r.url))
    for replica in listed:
        if replica.window is not None:
            total.merge(replica.window)
            counted.update(replica.partitions)
            if replica.oldest_need_human_ms is not None:
                waits.append(replica.oldest_need_human_ms)
    return {
        "window_s": WINDOW_S,
        "bounds": list(TIME_TO_CODE_BUCKETS),
        **total.as_json(),
        "oldest_need_human_ms": min(waits, default=None),
        "partitions": partitions,
        "missing_partitions": sorted(set(range(partitions)) - counted),
        "replicas": [replica.as_json() for replica in listed],
    }
