"""Anomaly rules: window aggregates, EWMA baselines and the pure evaluation of closed windows."""

from __future__ import annotations

import hashlib
import random
import uuid

import pytest

from app.playback.anomaly.baselines import Baseline, update_baseline
from app.playback.anomaly.rules import (
    ANOMALY_NAMESPACE,
    Finding,
    WindowAgg,
    anomaly_id,
    evaluate_window,
    merge_windows,
    to_anomaly,
)
from app.playback.anomaly.settings import AnomalyRuleSettings
from app.playback.anomaly.windows import PartitionState

W = 60_000


def code(index: int) -> str:
    return f"MA.156.10005.8361/AV2026{index:06d}"


def user_hash(index: int) -> str:
    return "sha256:" + hashlib.sha256(f"user-{index}".encode()).hexdigest()


Item = tuple[int, dict[str, object]]


class Traffic:
    """Uniform playback over codes x nodes x users, plus injected bursts and replays."""

    def __init__(self, seed: int, codes: int = 20, nodes: int = 5, users: int = 500) -> None:
        self.rng = random.Random(seed)
        self.codes = codes
        self.nodes = [str(8300 + i) for i in range(nodes)]
        self.users = [user_hash(i) for i in range(users)]

    def _item(self, ts: int, code_index: int, user: str | None = None) -> Item:
        rng = self.rng
        return ts, {
            "avcc_code": code(code_index),
            "platform_node": rng.choice(self.nodes),
            "user_hash": user or rng.choice(self.users),
            "event_type": "play",
            "duration_sec": rng.randint(1, 3600),
            "revenue_cny": "0.00",
        }

    def uniform(self, count: int, start: int, span: int) -> list[Item]:
        return [self._item(start + i * span // count, self.rng.randrange(self.codes)) for i in range(count)]

    def burst(self, count: int, start: int, span: int, code_index: int) -> list[Item]:
        return [self._item(start + i * span // count, code_index) for i in range(count)]

    def replay(self, count: int, start: int, span: int, code_index: int) -> list[Item]:
        return [self._item(start + i * span // count, code_index, user_hash(10**6)) for i in range(count)]


CFG = AnomalyRuleSettings(window_s=W // 1000, spike_min_count=100, replay_min_count=30, share_min_count=100)


def window(items: list[Item], cfg: AnomalyRuleSettings = CFG) -> WindowAgg:
    agg = WindowAgg()
    for _, p in items:
        agg.add(
            cfg,
            str(p["avcc_code"]),
            str(p["platform_node"]),
            str(p["user_hash"]),
            str(p["event_type"]),
            int(p["duration_sec"]),  # type: ignore[call-overload]
            p["revenue_cny"],
            str(uuid.uuid4()),
        )
    return agg


def history(traffic: Traffic, windows: int = 5, per_window: int = 3000) -> Baseline:
    """The baseline after ``windows`` windows of uniform traffic (no finding on the way)."""
    baseline = Baseline()
    for w in range(windows):
        agg = window(list(traffic.uniform(per_window, w * W, W)))
        assert evaluate_window(agg, baseline, CFG) == []
        update_baseline(baseline, agg, w * W, CFG)
    return baseline


def rules(findings: list[Finding]) -> list[str]:
    return sorted(f.rule for f in findings)


def test_uniform_traffic_yields_nothing() -> None:
    traffic = Traffic(seed=1)
    baseline = history(traffic, windows=8)
    assert baseline.codes[code(0)][1] == 8
    assert 120 < baseline.codes[code(0)][0] < 180  # ~150 per code per window


def test_ten_fold_spike_on_one_code_is_a_traffic_spike() -> None:
    traffic = Traffic(seed=2)
    baseline = history(traffic)
    items = list(traffic.uniform(3000, 5 * W, W)) + list(traffic.burst(1350, 5 * W, W, code_index=3))
    findings = evaluate_window(window(items), baseline, CFG)
    assert rules(findings) == ["traffic_spike"]
    spike = findings[0]
    assert spike.avcc_code == code(3)
    assert spike.observed >= 10 * 0.8 * 150
    assert spike.baseline is not None and spike.threshold == pytest.approx(
        CFG.spike_factor * spike.baseline, rel=1e-3
    )
    assert spike.evidence["code_events"] == spike.observed
    assert float(spike.evidence["factor"]) > CFG.spike_factor


def test_spike_needs_history_and_minimum_count() -> None:
    traffic = Traffic(seed=3)
    young = history(traffic, windows=2)  # fewer than min_history_windows
    items = list(traffic.uniform(3000, 2 * W, W)) + list(traffic.burst(1500, 2 * W, W, code_index=0))
    assert evaluate_window(window(items), young, CFG) == []
    small = AnomalyRuleSettings(window_s=W // 1000, spike_min_count=10_000)
    baseline = history(traffic, windows=5)
    assert [
        f for f in evaluate_window(window(items, small), baseline, small) if f.rule == "traffic_spike"
    ] == []


def test_one_user_replaying_one_code_is_a_user_replay() -> None:
    traffic = Traffic(seed=4)
    baseline = history(traffic)
    items = list(traffic.uniform(3000, 5 * W, W)) + list(traffic.replay(45, 5 * W, W, code_index=7))
    findings = evaluate_window(window(items), baseline, CFG)
    assert rules(findings) == ["user_replay"]
    replay = findings[0]
    assert replay.avcc_code == code(7)
    assert replay.user_hash == user_hash(10**6)
    assert replay.observed == 45 and replay.threshold == 30
    assert replay.key == f"{code(7)}|{user_hash(10**6)}"


def test_node_share_jump() -> None:
    traffic = Traffic(seed=5)
    baseline = history(traffic)
    items = list(traffic.uniform(3000, 5 * W, W))
    rng = random.Random(0)
    extra = [
        (5 * W, {**p, "platform_node": "9999"})
        for _, p in traffic.burst(300, 5 * W, W, code_index=2)
        if rng.random() < 2  # all of them
    ]
    findings = evaluate_window(window(items + extra), baseline, CFG)
    jumps = [f for f in findings if f.rule == "node_share_jump"]
    assert [(f.avcc_code, f.platform_node) for f in jumps] == [(code(2), "9999")]
    assert jumps[0].baseline == 0.0 and jumps[0].observed > 0.5


@pytest.mark.parametrize(
    ("event_type", "duration", "alternative"),
    [("play", 86_401, 0), ("complete", 0, 1), ("purchase", 90_000, 0)],
)
def test_impossible_duration(event_type: str, duration: int, alternative: int) -> None:
    traffic = Traffic(seed=6)
    items = list(traffic.uniform(100, 0, W))
    revenue = "1.00" if event_type == "purchase" else "0.00"
    bad = (0, {**items[0][1], "event_type": event_type, "duration_sec": duration, "revenue_cny": revenue})
    findings = evaluate_window(window([*items, bad, bad]), Baseline(), CFG)
    assert rules(findings) == ["impossible_duration"]
    found = findings[0]
    assert found.observed == duration and found.evidence["events"] == 2
    assert found.evidence["zero_second_completes"] == 2 * alternative


def test_revenue_on_play_and_purchase_out_of_bounds() -> None:
    traffic = Traffic(seed=7)
    items = list(traffic.uniform(100, 0, W))
    base = {k: v for k, v in items[0][1].items()}
    on_play = (
        0,
        {**base, "avcc_code": code(50), "event_type": "play", "duration_sec": 10, "revenue_cny": "3.50"},
    )
    huge = (
        0,
        {
            **base,
            "avcc_code": code(51),
            "event_type": "purchase",
            "duration_sec": 0,
            "revenue_cny": "20000.00",
        },
    )
    free = (
        0,
        {**base, "avcc_code": code(52), "event_type": "purchase", "duration_sec": 0, "revenue_cny": "0.00"},
    )
    findings = evaluate_window(window([*items, on_play, huge, free]), Baseline(), CFG)
    by_code = {f.avcc_code: f for f in findings}
    assert rules(findings) == ["revenue_out_of_bounds"] * 3
    assert by_code[code(50)].observed == 3.5 and by_code[code(50)].threshold == 0.0
    assert by_code[code(50)].evidence["revenue_on_non_purchase"] == 1
    assert by_code[code(51)].threshold == CFG.purchase_max_cny
    assert by_code[code(52)].threshold == CFG.purchase_min_cny


def test_zero_revenue_in_any_spelling_is_fine_on_play() -> None:
    agg = WindowAgg()
    for revenue in ("0.00", "0", 0, 0.0, "0.0"):
        agg.add(CFG, code(1), "1", user_hash(1), "play", 10, revenue, "e")
    assert agg.points == {}


def test_a_new_node_of_a_known_code_starts_as_if_it_had_zero_events_before() -> None:
    """Folding windows one by one gives the exact EWMA, also for a node that appears late."""
    baseline = Baseline()
    counts = [10, 10, 10]
    for w, n in enumerate(counts):
        agg = WindowAgg()
        for _ in range(n):
            agg.add(CFG, code(1), "8300", user_hash(1), "play", 10, "0.00", "e")
        if w == 2:
            for _ in range(4):
                agg.add(CFG, code(1), "8301", user_hash(2), "play", 10, "0.00", "e")
        update_baseline(baseline, agg, w * W, CFG)
    assert baseline.nodes[(code(1), "8301")] == pytest.approx(0.3 * 4)  # 0.7 x 0 + 0.3 x 4
    assert baseline.nodes[(code(1), "8300")] == pytest.approx(10.0)
    assert baseline.codes[code(1)] == [pytest.approx(0.3 * 14 + 0.7 * 10), 3.0]


def test_baseline_decays_over_skipped_windows_and_prunes() -> None:
    baseline = Baseline()
    agg = WindowAgg()
    for _ in range(10):
        agg.add(CFG, code(1), "1", user_hash(1), "play", 10, "0.00", "e")
    update_baseline(baseline, agg, 0, CFG)
    update_baseline(baseline, None, 3 * W, CFG)  # windows 1, 2 skipped, 3 empty
    assert baseline.codes[code(1)][0] == pytest.approx(10 * 0.7**3)
    update_baseline(baseline, None, 3 * W, CFG)  # idempotent per window
    assert baseline.codes[code(1)][0] == pytest.approx(10 * 0.7**3)
    update_baseline(baseline, None, 30 * W, CFG)
    assert baseline.codes == {} and baseline.nodes == {}


def test_merge_windows_sums_everything() -> None:
    traffic = Traffic(seed=9)
    items = list(traffic.uniform(600, 0, W))
    halves = [window(items[:300]), window(items[300:])]
    merged, whole = merge_windows(halves), window(items)
    assert (merged.codes, merged.nodes, merged.pairs, merged.events) == (
        whole.codes,
        whole.nodes,
        whole.pairs,
        whole.events,
    )


def test_anomaly_ids_are_deterministic_and_payload_is_valid() -> None:
    finding = Finding("traffic_spike", code(1), 900.0, 500.0, 100.0, avcc_code=code(1), evidence={"n": 1})
    first, second = (
        to_anomaly(finding, 0 + 1_700_000_000_000, 1_700_000_060_000),
        to_anomaly(finding, 1_700_000_000_000, 1_700_000_060_000),
    )
    assert first.anomaly_id == second.anomaly_id
    assert first.anomaly_id == str(uuid.uuid5(ANOMALY_NAMESPACE, f"traffic_spike|{code(1)}|1700000000000"))
    assert anomaly_id("traffic_spike", code(1), 1_700_000_060_000) != anomaly_id(
        "traffic_spike", code(1), 1_700_000_000_000
    )
    assert first.rule == "traffic_spike" and first.evidence == {"n": 1}


def test_snapshot_round_trip_keeps_state_and_drops_single_pairs() -> None:
    traffic = Traffic(seed=10)
    state = PartitionState(3, offset=42, watermark=5 * W + 7, closed_until=4 * W)
    state.windows[4 * W] = window(list(traffic.uniform(500, 4 * W, W)) + list(traffic.replay(5, 4 * W, W, 1)))
    state.windows[5 * W] = window(list(traffic.uniform(10, 5 * W, W)))
    restored = PartitionState.from_bytes(state.to_bytes(max_pairs=1000))
    assert (restored.partition, restored.offset, restored.watermark, restored.closed_until) == (
        3,
        42,
        5 * W + 7,
        4 * W,
    )
    agg, back = state.windows[4 * W], restored.windows[4 * W]
    assert back.codes == agg.codes and back.nodes == agg.nodes and back.events == agg.events
    assert back.pairs == {k: n for k, n in agg.pairs.items() if n >= 2}
    assert back.pairs[(code(1), user_hash(10**6))] == 5
    capped = PartitionState.from_bytes(state.to_bytes(max_pairs=1))
    assert len(capped.windows[4 * W].pairs) == 1
