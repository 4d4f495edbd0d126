"""Synthetic lag snapshots and rules shared by the lag unit tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.ops.lag.monitor import LagReport
from app.ops.lag.settings import LagRule, LagSettings
from app.platform.lag.snapshot import GroupState, LagSnapshot, PartitionOffsets
from app.platform.metrics import REGISTRY

T0 = 1_700_000_000.0
TOPIC = "t.apply"
GROUP = "g-review"


def rule(**kw: Any) -> LagRule:
    base: dict[str, Any] = {
        "name": "ApplyLag",
        "topic": TOPIC,
        "groups": (GROUP,),
        "max_lag": 1000,
        "not_shrinking_s": 60.0,
        "action": "scale out review",
        "scale_group": "review",
    }
    base.update(kw)
    return LagRule(**base)


def config(*rules: LagRule, **kw: Any) -> LagSettings:
    values: dict[str, Any] = {
        "rules": rules or (rule(),),
        "interval_s": 5.0,
        "window_s": 60.0,
        "repeat_s": 300.0,
    }
    values.update(kw)
    return LagSettings(**values)


def snap(
    t: float,
    parts: Sequence[tuple[int, int, int | None]],
    *,
    group: str = GROUP,
    topic: str = TOPIC,
    state: str = "STABLE",
    errors: dict[str, str] | None = None,
) -> LagSnapshot:
    """Snapshot at T0 + t of ``group`` on ``topic``: ``(partition, end, committed)`` tuples."""
    rows = tuple(PartitionOffsets(group, topic, p, end, committed) for p, end, committed in parts)
    return LagSnapshot(T0 + t, rows, {group: GroupState(group, state, 1)}, errors or {})


def one(t: float, end: int, committed: int | None, **kw: Any) -> LagSnapshot:
    return snap(t, [(0, end, committed)], **kw)


def kinds(report: LagReport) -> list[str]:
    return [e.kind for e in report.events]


def sample(name: str, **labels: str) -> float | None:
    """Current value of a Prometheus series (``None`` when it is not exported)."""
    return REGISTRY.get_sample_value(name, labels)
