"""Lag evaluation: rules, Burrow-style status and the alert lifecycle on synthetic offset histories."""

from __future__ import annotations

import pytest

from app.ops.lag.monitor import LagEvaluator, LagReport
from app.ops.lag.settings import LagSettings, default_rules
from app.platform.lag.snapshot import BROKER_ERROR, LagSnapshot, PartitionOffsets
from app.platform.topics import APPLY_CREATED, PLAYBACK_EVENT
from tests.unit.ops.lag.lag_samples import GROUP, T0, config, kinds, one, rule, snap

# ----------------------------------------------------------------------------- offsets


def test_lag_is_end_minus_committed_and_never_negative() -> None:
    assert PartitionOffsets("g", "t", 0, end=100, committed=40).lag == 60
    # An end offset read before a commit that has since moved past it: lag 0, never negative.
    assert PartitionOffsets("g", "t", 0, end=100, committed=130).lag == 0
    # Never committed: everything from the low watermark is lag.
    assert PartitionOffsets("g", "t", 0, end=100, committed=None, low=30).lag == 70


# ----------------------------------------------------------------------------- rules


def test_default_rules_are_the_seeds_9_3_4() -> None:
    rules = {r.topic: r for r in default_rules()}
    apply = rules[APPLY_CREATED.name]
    assert apply.max_lag == 1000 and apply.not_shrinking_s == 60.0
    assert apply.groups == ("avcc-review",) and apply.scale_group == "review"
    assert "scale out" in apply.action
    playback = rules[PLAYBACK_EVENT.name]
    assert playback.max_lag == 50_000 and playback.not_shrinking_s is None
    assert set(playback.groups) == {"avcc-sink", "avcc-anomaly"}
    assert "ClickHouse" in playback.action


def test_rules_configurable_from_json_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AVCC_LAG_RULES",
        '[{"name": "X", "topic": "topic.x", "groups": ["avcc-x"], "max_lag": 5, "severity": "P1"}]',
    )
    monkeypatch.setenv("AVCC_LAG_REPEAT_S", "42")
    settings = LagSettings()
    assert settings.repeat_s == 42
    assert [(r.name, r.topic, r.groups, r.max_lag, r.severity) for r in settings.rules] == [
        ("X", "topic.x", ("avcc-x",), 5, "P1")
    ]


def test_threshold_is_strictly_greater() -> None:
    ev = LagEvaluator(config(rule(not_shrinking_s=None)))
    assert not ev.observe(one(0, 1000, 0)).active_alerts
    assert kinds(ev.observe(one(5, 1001, 0))) == ["firing"]


def test_alert_fires_once_repeats_on_schedule_and_resolves_once() -> None:
    ev = LagEvaluator(config(rule(not_shrinking_s=None), repeat_s=300.0))
    seen: list[tuple[float, str]] = []
    for t in range(0, 700, 5):
        report = ev.observe(one(t, 1500 + t, 0))
        seen += [(t, k) for k in kinds(report)]
    assert seen == [(0, "firing"), (300, "repeat"), (600, "repeat")]
    report = ev.observe(one(700, 2200, 2200))
    assert kinds(report) == ["resolved"]
    assert report.events[0].started_at == T0 and report.events[0].at == T0 + 700
    assert kinds(ev.observe(one(705, 2200, 2200))) == []
    # a new breach is a new alert
    assert kinds(ev.observe(one(710, 4000, 2200))) == ["firing"]


def test_not_shrinking_lag_fires_after_the_window() -> None:
    ev = LagEvaluator(config(rule(max_lag=None, not_shrinking_s=60.0)))
    fired_at = None
    for t in range(0, 120, 5):
        # consumer keeps committing, producers keep pace: lag stays at 10, never shrinks
        report = ev.observe(one(t, 1000 + t * 10, 990 + t * 10))
        if "firing" in kinds(report):
            fired_at = t
    assert fired_at == 60
    assert "not shrinking" in ev.last_report.active_alerts[0].reason  # type: ignore[union-attr]


def test_shrinking_lag_does_not_fire_and_a_firing_alert_resolves_when_lag_shrinks() -> None:
    ev = LagEvaluator(config(rule(max_lag=None, not_shrinking_s=60.0)))
    for t in range(0, 200, 5):
        assert not ev.observe(one(t, 5000, 4000 + t * 4)).active_alerts  # lag 1000 -> 200, shrinking
    ev2 = LagEvaluator(config(rule(max_lag=None, not_shrinking_s=60.0)))
    for t in range(0, 65, 5):
        ev2.observe(one(t, 100, 50))
    assert ev2.last_report is not None and ev2.last_report.active_alerts
    events: list[str] = []
    for t in range(65, 200, 5):
        events += kinds(ev2.observe(one(t, 100, 50 + (t - 60))))  # draining
    assert events == ["resolved"]


def test_lag_reaching_zero_inside_the_window_prevents_the_duration_alert() -> None:
    ev = LagEvaluator(config(rule(max_lag=None, not_shrinking_s=60.0)))
    for t in range(0, 200, 5):
        committed = 100 if t % 50 == 0 else 90  # drains to 0 every 50 s
        assert not ev.observe(one(t, 100, committed)).active_alerts


def test_rule_for_a_group_that_never_committed_counts_from_the_low_watermark() -> None:
    ev = LagEvaluator(config(rule(not_shrinking_s=None)))
    report = ev.observe(snap(0, [(p, 250, None) for p in range(6)], state="DEAD"))
    assert report.active_alerts and report.active_alerts[0].lag == 1500


def test_rule_without_the_topic_in_the_snapshot_does_not_fire() -> None:
    ev = LagEvaluator(config(rule(topic="other")))
    report = ev.observe(one(0, 5000, 0))
    assert not report.active_alerts
    assert report.rules[0].reason == "topic not found"


# ----------------------------------------------------------------------------- status


def status_at(ev: LagEvaluator, report: LagReport) -> str:
    return report.topics[0].status


def test_stall_when_committed_is_frozen_with_live_members() -> None:
    ev = LagEvaluator(config())
    statuses = [status_at(ev, ev.observe(one(t, 200 + t, 100, state="STABLE"))) for t in range(0, 70, 5)]
    assert statuses[:12] == ["OK"] * 12  # window (60 s) not yet covered
    assert statuses[12:] == ["STALL", "STALL"]


def test_stop_when_the_group_has_no_members() -> None:
    ev = LagEvaluator(config())
    report = ev.observe(one(0, 200, 100, state="EMPTY"))
    assert report.topics[0].status == "STOP"
    assert "no members" in report.topics[0].reason


def test_stop_when_nothing_was_committed_for_the_window_and_nobody_is_known_alive() -> None:
    ev = LagEvaluator(config())
    statuses = [status_at(ev, ev.observe(one(t, 200, None, state="UNKNOWN"))) for t in range(0, 65, 5)]
    assert statuses[-1] == "STOP" and statuses[0] == "OK"


def test_warn_when_lag_grows_at_every_sample_while_committing() -> None:
    ev = LagEvaluator(config())
    statuses = [status_at(ev, ev.observe(one(t, 100 + 3 * t, 100 + t))) for t in range(0, 70, 5)]
    assert statuses[-1] == "WARN"


def test_ok_when_committing_and_lag_fluctuates() -> None:
    ev = LagEvaluator(config())
    for t in range(0, 120, 5):
        report = ev.observe(one(t, 1000 + 10 * t, 1000 + 10 * t - (5 if t % 10 else 20)))
    assert report.topics[0].status == "OK"


def test_ok_without_lag_even_when_frozen() -> None:
    ev = LagEvaluator(config())
    for t in range(0, 120, 5):
        report = ev.observe(one(t, 100, 100, state="EMPTY"))
    assert report.topics[0].status == "OK"


def test_group_topic_status_is_the_worst_partition() -> None:
    ev = LagEvaluator(config())
    for t in range(0, 65, 5):
        report = ev.observe(snap(t, [(0, 100, 100), (1, 200 + t, 100 + t), (2, 300, 250)]))
    by_partition = {p.offsets.partition: p.status for p in report.topics[0].partitions}
    assert by_partition == {0: "OK", 1: "OK", 2: "STALL"}
    assert report.topics[0].status == "STALL" and report.topics[0].reason.startswith("p2:")
    assert report.topics[0].lag == 150


def test_err_for_a_group_whose_offsets_could_not_be_read() -> None:
    ev = LagEvaluator(config())
    report = ev.observe(one(0, 100, 50, errors={GROUP: "KafkaException: boom"}))
    assert report.topics[0].status == "ERR"
    report = ev.observe(LagSnapshot(T0 + 5, (), {}, {"other": "KafkaException: gone"}))
    assert [(t.group, t.status) for t in report.topics] == [("other", "ERR")]


def test_broker_error_keeps_alerts_and_marks_everything_err() -> None:
    ev = LagEvaluator(config(rule(not_shrinking_s=None)))
    assert kinds(ev.observe(one(0, 5000, 0))) == ["firing"]
    report = ev.observe(LagSnapshot(T0 + 5, errors={BROKER_ERROR: "broker down"}))
    assert report.events == () and report.active_alerts  # no resolve while blind
    assert {t.status for t in report.topics} == {"ERR"}
    assert kinds(ev.observe(one(10, 5000, 5000))) == ["resolved"]


def test_history_is_bounded() -> None:
    ev = LagEvaluator(config())
    for t in range(0, 5000, 5):
        ev.observe(one(t, 100, 100))
    assert max(len(h) for h in ev._partitions.values()) <= 2 + int(ev.config.history_s / 5)
