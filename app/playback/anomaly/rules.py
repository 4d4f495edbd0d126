"""Anomaly rules of the playback stream: window aggregates, EWMA baselines, pure evaluation.

One event-time tumbling window of ``window_ms`` is summarised by a :class:`WindowAgg` (counts per
code, per (code, node), per (code, user) and the per-event rule hits). When the window closes,
:func:`evaluate_window` compares it with the :class:`~app.playback.anomaly.baselines.Baseline`
built from the windows before it and returns :class:`Finding` s;
:func:`~app.playback.anomaly.baselines.update_baseline` then folds the window into the baseline.

Rules (thresholds in :class:`~app.playback.anomaly.settings.AnomalyRuleSettings`):

``traffic_spike``
    a code's count >= ``spike_factor`` x its baseline (EWMA of its previous window counts) and
    >= ``spike_min_count``; only once the code has ``min_history_windows`` of history.
``user_replay``
    one ``user_hash`` played one code >= ``replay_min_count`` times in the window.
``node_share_jump``
    a platform node's share of a code's window traffic exceeds its baseline share (EWMA of node
    counts / EWMA of code counts) by >= ``share_jump`` (absolute), for codes with
    >= ``share_min_count`` events and enough history.
``impossible_duration``
    ``duration_sec`` above ``max_duration_sec[event_type]``, or a ``complete`` lasting 0 s.
``revenue_out_of_bounds``
    revenue on a ``play``/``complete``, or a ``purchase`` outside
    [``purchase_min_cny``, ``purchase_max_cny``].

The last two are checked per event (:meth:`WindowAgg.add`) but reported once per
(rule, code, window) with counts and a sample event, so a misbehaving node cannot flood the
anomaly topic. Every finding has a deterministic id (:func:`anomaly_id`: uuid5 of rule, key and
window start), so evaluating the same window again (a replay after a crash) yields the same ids.

EWMA baselines (kept by stage 2, per code) are in :mod:`app.playback.anomaly.baselines`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

from app.playback.anomaly.baselines import SEP, Baseline, split_key
from app.playback.anomaly.settings import AnomalyRuleSettings
from schemas.system import AnomalyDetected
from schemas.types import AnomalyRule

__all__ = [
    "ANOMALY_NAMESPACE",
    "Finding",
    "WindowAgg",
    "anomaly_id",
    "evaluate_window",
    "merge_windows",
    "to_anomaly",
]

#: Namespace of anomaly ids: uuid5(ANOMALY_NAMESPACE, "<rule>|<key>|<window start ms>").
ANOMALY_NAMESPACE: Final = uuid.UUID("0b6f2a53-2f41-5c8e-b0a7-6a3d9c1e4f27")
_ZEROS: Final = frozenset({"0.00", "0", "0.0", 0})
_DAY: Final = 24 * 3600


class WindowAgg:
    """Counters of one window (of one source partition, or merged over several)."""

    __slots__ = ("codes", "events", "nodes", "pairs", "points")

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        #: (code, node) -> count
        self.nodes: dict[tuple[str, str], int] = {}
        #: (code, user_hash) -> count
        self.pairs: dict[tuple[str, str], int] = {}
        #: (rule, code) -> [count, max observed, threshold of max, sample event id, node, user, alt count]
        self.points: dict[tuple[str, str], list[Any]] = {}
        self.events = 0

    def add(
        self,
        cfg: AnomalyRuleSettings,
        code: str,
        node: str,
        user: str,
        event_type: str,
        duration_sec: int,
        revenue: Any,
        event_id: str,
    ) -> None:
        """Count one playback event (the hot path: a few dict updates)."""
        self.events += 1
        codes = self.codes
        codes[code] = codes.get(code, 0) + 1
        key = (code, node)
        nodes = self.nodes
        nodes[key] = nodes.get(key, 0) + 1
        key = (code, user)
        pairs = self.pairs
        pairs[key] = pairs.get(key, 0) + 1
        limit = cfg.max_duration_sec.get(event_type, _DAY)
        if duration_sec > limit or (duration_sec == 0 and event_type == "complete"):
            zero_complete = duration_sec <= limit
            self._point("impossible_duration", code, duration_sec, limit, event_id, node, user, zero_complete)
        if event_type == "purchase":
            amount = float(revenue)
            if not cfg.purchase_min_cny <= amount <= cfg.purchase_max_cny:
                bound = cfg.purchase_min_cny if amount < cfg.purchase_min_cny else cfg.purchase_max_cny
                self._point("revenue_out_of_bounds", code, amount, bound, event_id, node, user, False)
        elif revenue not in _ZEROS:
            amount = float(revenue)
            if amount != 0.0:
                self._point("revenue_out_of_bounds", code, amount, 0.0, event_id, node, user, True)

    def _point(
        self,
        rule: str,
        code: str,
        observed: float,
        threshold: float,
        event_id: str,
        node: str,
        user: str,
        alternative: bool,
    ) -> None:
        entry = self.points.get((rule, code))
        if entry is None:
            self.points[(rule, code)] = [1, observed, threshold, event_id, node, user, int(alternative)]
            return
        entry[0] += 1
        entry[6] += int(alternative)
        if observed > entry[1]:
            entry[1:6] = [observed, threshold, event_id, node, user]

    def merge(self, other: WindowAgg) -> None:
        """Add ``other``'s counts to this window (in place)."""
        self.events += other.events
        codes = self.codes
        for code, count in other.codes.items():
            codes[code] = codes.get(code, 0) + count
        for src, dst in ((other.nodes, self.nodes), (other.pairs, self.pairs)):
            for key, count in src.items():
                dst[key] = dst.get(key, 0) + count
        for key, entry in other.points.items():
            mine = self.points.get(key)
            if mine is None:
                self.points[key] = list(entry)
                continue
            mine[0] += entry[0]
            mine[6] += entry[6]
            if entry[1] > mine[1]:
                mine[1:6] = entry[1:6]

    def to_json(self, max_pairs: int | None, min_pair_count: int = 2) -> dict[str, Any]:
        """JSON-ready form. For snapshots pairs seen once are left out (they cannot make a replay
        finding on their own; at worst a restored window undercounts a pair by one), and at most
        ``max_pairs`` of the biggest are kept: the snapshot stays bounded. Partials for stage 2
        keep every pair (``max_pairs=None, min_pair_count=1``): a user's plays are spread over
        the source partitions, one or two in each."""
        pairs = [(k, n) for k, n in self.pairs.items() if n >= min_pair_count]
        if max_pairs is not None and len(pairs) > max_pairs:
            pairs.sort(key=lambda kv: kv[1], reverse=True)
            del pairs[max_pairs:]
        return {
            "events": self.events,
            "codes": self.codes,
            "nodes": {f"{c}{SEP}{n}": v for (c, n), v in self.nodes.items()},
            "pairs": {f"{c}{SEP}{u}": v for (c, u), v in pairs},
            "points": {f"{r}{SEP}{c}": v for (r, c), v in self.points.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WindowAgg:
        """Inverse of :meth:`to_json`."""
        agg = cls()
        agg.events = int(data.get("events", 0))
        agg.codes = {str(k): int(v) for k, v in data.get("codes", {}).items()}
        agg.nodes = {split_key(k): int(v) for k, v in data.get("nodes", {}).items()}
        agg.pairs = {split_key(k): int(v) for k, v in data.get("pairs", {}).items()}
        agg.points = {split_key(k): list(v) for k, v in data.get("points", {}).items()}
        return agg


def merge_windows(aggs: Iterable[WindowAgg]) -> WindowAgg:
    """One window summing ``aggs`` (the inputs are left unchanged)."""
    merged = WindowAgg()
    for agg in aggs:
        merged.merge(agg)
    return merged


@dataclass(frozen=True, slots=True)
class Finding:
    """One anomaly of one window, before it becomes an :class:`AnomalyDetected` event."""

    rule: AnomalyRule
    #: What the finding is about (code; code+user; code+node): part of its deterministic id.
    key: str
    observed: float
    threshold: float
    baseline: float | None = None
    avcc_code: str | None = None
    platform_node: str | None = None
    user_hash: str | None = None
    evidence: Mapping[str, str | int | float] = field(default_factory=dict)


def anomaly_id(rule: str, key: str, window_start_ms: int) -> uuid.UUID:
    """Deterministic id of a finding: the same window evaluated again gets the same id."""
    return uuid.uuid5(ANOMALY_NAMESPACE, f"{rule}|{key}|{window_start_ms}")


def _history(baseline: Baseline, code: str, cfg: AnomalyRuleSettings) -> float | None:
    entry = baseline.codes.get(code)
    if entry is None or entry[1] < cfg.min_history_windows:
        return None
    return entry[0]


def evaluate_window(agg: WindowAgg, baseline: Baseline, cfg: AnomalyRuleSettings) -> list[Finding]:
    """The findings of a closed window against the baseline of the windows before it (pure)."""
    findings: list[Finding] = []
    window_s = cfg.window_ms // 1000
    for code, count in agg.codes.items():
        if count < cfg.spike_min_count:
            continue
        base = _history(baseline, code, cfg)
        if base is None:
            continue
        threshold = max(cfg.spike_factor * base, float(cfg.spike_min_count))
        if count >= threshold:
            findings.append(
                Finding(
                    "traffic_spike",
                    code,
                    float(count),
                    round(threshold, 3),
                    round(base, 3),
                    avcc_code=code,
                    evidence={
                        "window_s": window_s,
                        "code_events": count,
                        "window_events": agg.events,
                        "baseline_ewma": round(base, 3),
                        "factor": round(count / base, 3) if base > 0 else "inf",
                        "spike_factor": cfg.spike_factor,
                    },
                )
            )
    for (code, user), count in agg.pairs.items():
        if count >= cfg.replay_min_count:
            findings.append(
                Finding(
                    "user_replay",
                    f"{code}|{user}",
                    float(count),
                    float(cfg.replay_min_count),
                    avcc_code=code,
                    user_hash=user,
                    evidence={
                        "window_s": window_s,
                        "user_plays": count,
                        "code_events": agg.codes.get(code, 0),
                        "replay_min_count": cfg.replay_min_count,
                    },
                )
            )
    for (code, node), count in agg.nodes.items():
        total = agg.codes.get(code, 0)
        if total < cfg.share_min_count:
            continue
        base_code = _history(baseline, code, cfg)
        if not base_code:
            continue
        base_share = min(1.0, baseline.nodes.get((code, node), 0.0) / base_code)
        share = count / total
        if share - base_share >= cfg.share_jump:
            findings.append(
                Finding(
                    "node_share_jump",
                    f"{code}|{node}",
                    round(share, 6),
                    round(base_share + cfg.share_jump, 6),
                    round(base_share, 6),
                    avcc_code=code,
                    platform_node=node,
                    evidence={
                        "window_s": window_s,
                        "node_events": count,
                        "code_events": total,
                        "share": round(share, 4),
                        "baseline_share": round(base_share, 4),
                        "share_jump": cfg.share_jump,
                    },
                )
            )
    for (rule, code), entry in agg.points.items():
        count, observed, threshold, sample, node, user, alternative = entry
        evidence: dict[str, str | int | float] = {
            "window_s": window_s,
            "events": int(count),
            "sample_event_id": str(sample),
            "sample_platform_node": str(node),
        }
        if rule == "impossible_duration":
            evidence["zero_second_completes"] = int(alternative)
            evidence["max_duration_sec"] = float(observed)
        else:
            evidence["revenue_on_non_purchase"] = int(alternative)
            evidence["max_revenue_cny"] = float(observed)
        findings.append(
            Finding(
                cast("AnomalyRule", rule),
                code,
                abs(float(observed)),
                float(threshold),
                avcc_code=code,
                evidence=evidence,
            )
        )
    return findings


def to_anomaly(finding: Finding, window_start_ms: int, window_end_ms: int) -> AnomalyDetected:
    """The ``topic.playback.anomaly`` payload of a finding (raises ``ValidationError`` on
    values the contract refuses, e.g. a malformed code that slipped into the stream)."""
    return AnomalyDetected(
        anomaly_id=str(anomaly_id(finding.rule, finding.key, window_start_ms)),
        rule=finding.rule,
        avcc_code=finding.avcc_code,
        platform_node=finding.platform_node,
        user_hash=finding.user_hash,
        window_start_ms=window_start_ms,
        window_end_ms=window_end_ms,
        observed=finding.observed,
        baseline=finding.baseline,
        threshold=finding.threshold,
        evidence=dict(finding.evidence),
    )
