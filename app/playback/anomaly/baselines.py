"""EWMA baselines of the anomaly rules: what a code's (and a node's) window counts usually are.

Stage 2 of the detector (:mod:`app.playback.anomaly.merge`) keeps one baseline per bucket of
codes and folds in each window once it has the counts of every source partition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from app.playback.anomaly.rules import WindowAgg
    from app.playback.anomaly.settings import AnomalyRuleSettings

__all__ = ["SEP", "Baseline", "split_key", "update_baseline"]

#: Separator of the two parts of a pair key in JSON snapshots (``code<TAB>node``).
SEP: Final = "\t"


def split_key(key: str) -> tuple[str, str]:
    """The ``(first, second)`` pair of a JSON pair key (inverse of joining with :data:`SEP`)."""
    first, _, second = key.partition(SEP)
    return first, second


@dataclass(slots=True)
class Baseline:
    """EWMA of past window counts of a set of codes."""

    #: code -> [ewma of count, windows seen]
    codes: dict[str, list[float]] = field(default_factory=dict)
    #: (code, node) -> ewma of count
    nodes: dict[tuple[str, str], float] = field(default_factory=dict)
    #: Start of the last window folded in (``None``: none yet).
    last_window: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "last_window": self.last_window,
            "codes": {c: [round(e[0], 6), int(e[1])] for c, e in self.codes.items()},
            "nodes": {f"{c}{SEP}{n}": round(v, 6) for (c, n), v in self.nodes.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Baseline:
        """Inverse of :meth:`to_json`."""
        last = data.get("last_window")
        return cls(
            codes={str(c): [float(e[0]), float(e[1])] for c, e in data.get("codes", {}).items()},
            nodes={split_key(k): float(v) for k, v in data.get("nodes", {}).items()},
            last_window=int(last) if last is not None else None,
        )


def update_baseline(
    baseline: Baseline,
    agg: WindowAgg | None,
    window_start: int,
    cfg: AnomalyRuleSettings,
) -> Baseline:
    """Fold the window starting at ``window_start`` into ``baseline`` (in place; returned).

    ``agg`` is ``None`` when the window had no events here: every entry then decays. Windows
    skipped since the last fold (no events at all) decay the entries once each. A window at or
    before the last folded one is ignored (folding is idempotent per window). A new code starts
    at its count, a new node of a known code at ``alpha * count``.
    """
    last = baseline.last_window
    if last is not None and window_start <= last:
        return baseline
    alpha = cfg.ewma_alpha
    keep = 1.0 - alpha
    codes = agg.codes if agg is not None else {}
    nodes = agg.nodes if agg is not None else {}
    if last is not None:
        gap = (window_start - last) // cfg.window_ms - 1
        if gap > 0:
            decay = keep**gap
            for entry in baseline.codes.values():
                entry[0] *= decay
            for key in baseline.nodes:
                baseline.nodes[key] *= decay
    for code, entry in baseline.codes.items():
        entry[0] = alpha * codes.get(code, 0) + keep * entry[0]
        entry[1] += 1
    for key, value in baseline.nodes.items():
        baseline.nodes[key] = alpha * nodes.get(key, 0) + keep * value
    for key, count in nodes.items():
        if key not in baseline.nodes:
            # a new node of a known code had 0 events before; a new code starts at its count
            baseline.nodes[key] = alpha * count if key[0] in baseline.codes else float(count)
    for code, count in codes.items():
        if code not in baseline.codes:
            baseline.codes[code] = [float(count), 1.0]
    floor = cfg.baseline_floor
    dropped = {c for c, e in baseline.codes.items() if e[0] < floor}
    if len(baseline.codes) - len(dropped) > cfg.baseline_max_codes:
        ranked = sorted((e[0], c) for c, e in baseline.codes.items() if c not in dropped)
        dropped.update(c for _, c in ranked[: len(ranked) - cfg.baseline_max_codes])
    for code in dropped:
        del baseline.codes[code]
    stale = [k for k, v in baseline.nodes.items() if v < floor or k[0] in dropped]
    for key in stale:
        del baseline.nodes[key]
    baseline.last_window = window_start
    return baseline
