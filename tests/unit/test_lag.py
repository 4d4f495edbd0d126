"""Lag monitor core: rules, Burrow-style status and the alert lifecycle on synthetic offset histories."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP

from app.ops.alerts import Alert
from app.ops.lag import monitor as lag_mod
from app.ops.lag.monitor import (
    AlertEvent,
    GroupState,
    LagEvaluator,
    LagMonitor,
    LagReport,
    LagRule,
    LagSettings,
    LagSnapshot,
    PartitionOffsets,
    alertmanager_payload,
    default_rules,
    format_lag_table,
    render_lag_html,
)
from app.platform.http.views import WorkerLagExporter, WorkerState, install_common_views, readiness
from app.platform.metrics import REGISTRY
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, PLAYBACK_EVENT

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


# ----------------------------------------------------------------------------- offsets


def test_lag_is_end_minus_committed_and_never_negative() -> None:
    assert PartitionOffsets("g", "t", 0, end=100, committed=40).lag == 60
    # Tansu reports end offsets that lag the log: a committed offset past "end" is lag 0.
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
    report = ev.observe(LagSnapshot(T0 + 5, errors={lag_mod.BROKER_ERROR: "broker down"}))
    assert report.events == () and report.active_alerts  # no resolve while blind
    assert {t.status for t in report.topics} == {"ERR"}
    assert kinds(ev.observe(one(10, 5000, 5000))) == ["resolved"]


def test_history_is_bounded() -> None:
    ev = LagEvaluator(config())
    for t in range(0, 5000, 5):
        ev.observe(one(t, 100, 100))
    assert max(len(h) for h in ev._partitions.values()) <= 2 + int(ev.config.history_s / 5)


# ----------------------------------------------------------------------------- alerts out


def event(kind: str, at: float = 60.0) -> AlertEvent:
    return AlertEvent(kind, rule(), GROUP, TOPIC, 1500, "lag 1500 > 1000", T0, T0 + at)  # type: ignore[arg-type]


def test_alertmanager_payload_shape() -> None:
    firing, resolved = alertmanager_payload([event("firing"), event("resolved")], repeat_s=300.0)
    for alert in (firing, resolved):
        assert set(alert) == {"labels", "annotations", "startsAt", "endsAt"}
        assert alert["labels"] == {
            "alertname": "ApplyLag",
            "severity": "P2",
            "group": GROUP,
            "topic": TOPIC,
            "service": "avcc",
            "scale_group": "review",
        }
        assert alert["annotations"]["recommendation"] == "scale out review"
        assert alert["startsAt"] == "2023-11-14T22:13:20.000Z"
    assert firing["annotations"]["status"] == "firing"
    assert resolved["endsAt"] == "2023-11-14T22:14:20.000Z"  # resolved: ends now
    assert datetime.fromisoformat(firing["endsAt"]) > datetime.fromisoformat(resolved["endsAt"])


class FakeReader:
    def __init__(self, snapshots: list[LagSnapshot]) -> None:
        self.snapshots = snapshots
        self.closed = False

    def snapshot(self) -> LagSnapshot:
        return self.snapshots.pop(0)

    def close(self) -> None:
        self.closed = True


class FakeSink:
    def __init__(self) -> None:
        self.sent: list[Alert] = []
        self.closed = False

    async def send(self, alerts: Sequence[Alert]) -> None:
        self.sent.extend(alerts)

    async def close(self) -> None:
        self.closed = True


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_monitor_exports_metrics_drops_stale_series_and_notifies_sinks() -> None:
    group, topic = "g-mon-unit", "t-mon-unit"
    cfg = config(rule(topic=topic, groups=(group,), not_shrinking_s=None))
    reader = FakeReader(
        [
            snap(0, [(0, 1500, 0), (1, 10, 10)], group=group, topic=topic),
            snap(5, [(0, 1500, 1500)], group=group, topic=topic),
        ]
    )
    sink = FakeSink()
    monitor = LagMonitor(Settings(), cfg, reader=reader, sinks=[sink])  # type: ignore[arg-type]
    await monitor.tick()
    assert sample("avcc_consumer_lag_messages", group=group, topic=topic, partition="0") == 1500
    assert sample("avcc_consumer_lag_messages", group=group, topic=topic, partition="1") == 0
    assert sample("avcc_lag_alert_active", rule="ApplyLag", group=group, topic=topic) == 1
    assert [a.annotations["status"] for a in sink.sent] == ["firing"]
    await monitor.tick()
    assert sample("avcc_consumer_lag_messages", group=group, topic=topic, partition="0") == 0
    assert sample("avcc_consumer_lag_messages", group=group, topic=topic, partition="1") is None
    assert sample("avcc_lag_alert_active", rule="ApplyLag", group=group, topic=topic) == 0
    assert sample("avcc_consumer_lag_status", group=group, topic=topic) == 0
    assert [a.annotations["status"] for a in sink.sent] == ["firing", "resolved"]
    assert sink.sent[1].ends_at is not None
    await monitor.close()
    assert reader.closed and sink.closed


# ----------------------------------------------------------------------------- presentation


def test_table_and_html_show_every_partition_and_the_alert() -> None:
    ev = LagEvaluator(config(rule(not_shrinking_s=None)))
    report = ev.observe(snap(0, [(0, 1500, None), (1, 20, 10)], group="g<x>"))
    text = format_lag_table(report)
    lines = text.splitlines()
    assert lines[0].split() == ["group", "topic", "partition", "end", "committed", "lag", "status"]
    assert lines[1].split() == ["g<x>", TOPIC, "0", "1500", "-", "1500", "OK"]
    page = render_lag_html(report)
    assert "<td>g&lt;x&gt;</td>" in page and "g<x>" not in page
    assert page.count("<tr data-status=") == 2
    assert "No snapshot yet" in render_lag_html(None)


def test_print_lag_table_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshots = [one(0, 10, 10), one(0, 5000, 0), LagSnapshot(T0, errors={lag_mod.BROKER_ERROR: "down"})]
    monkeypatch.setattr(lag_mod.OffsetReader, "snapshot", lambda self: snapshots.pop(0))
    cfg = config(rule(not_shrinking_s=None))
    assert lag_mod.print_lag_table(Settings(), cfg) == 0
    assert lag_mod.print_lag_table(Settings(), cfg) == 1
    assert "ALERT ApplyLag" in capsys.readouterr().out
    assert lag_mod.print_lag_table(Settings(), cfg) == 2


# ----------------------------------------------------------------------------- worker views


class FakeConsumer:
    def __init__(self, assignment: set[Any] | None) -> None:
        self._assignment = assignment
        self.randomly_assigned_topics = {"avcc-x-__assignor-__leader"}

    def assignment(self) -> set[Any]:
        if self._assignment is None:
            raise RuntimeError("ConsumerNotStarted")
        return self._assignment


def fake_app(assignment: set[Any] | None, *, completed: bool = True, agents: bool = True) -> Any:
    event = asyncio.Event()
    if completed:
        event.set()
    tables = SimpleNamespace(
        recovery=SimpleNamespace(completed=event), changelog_topics={"avcc-x-t-changelog"}
    )
    return SimpleNamespace(
        crashed=False,
        in_recovery=False,
        agents={"a": 1} if agents else {},
        tables=tables,
        conf=SimpleNamespace(reply_to="avcc-x-replies"),
        _consumer=FakeConsumer(assignment),
    )


def tp(topic: str, partition: int) -> TP:
    return TP(topic, partition)


def test_ready_states() -> None:
    state = WorkerState("x", consumer=True, started=False)
    assert readiness(fake_app({tp("a", 0)}), state)[1]["status"] == "starting"
    state.started = True
    assert readiness(fake_app(None), state)[1]["status"] == "starting"
    assert readiness(fake_app(set()), state)[1]["status"] == "unassigned"
    assert readiness(fake_app({tp("a", 0)}, completed=False), state)[1]["status"] == "recovering"
    ok, body = readiness(fake_app({tp("a", 0)}), state)
    assert ok and body["partitions"] == 1
    # a group without a Kafka consumer (gateway) is ready once started
    assert readiness(fake_app(None, agents=False), WorkerState("gateway", consumer=False, started=True))[0]


def test_ready_follows_a_groups_own_consumer_and_check() -> None:
    owned: list[tuple[str, int]] = []
    healthy = [False]
    state = WorkerState(
        "sink",
        consumer=False,
        started=True,
        assignment=lambda: owned,
        ready_check=lambda: (healthy[0], "clickhouse down"),
    )
    app = fake_app(None, agents=False)
    assert readiness(app, state)[1]["status"] == "unassigned"
    owned.append(("topic.playback.event", 3))
    assert readiness(app, state)[1] == {"group": "sink", "status": "not_ready", "reason": "clickhouse down"}
    healthy[0] = True
    assert readiness(app, state) == (
        True,
        {"group": "sink", "status": "ready", "consumer": True, "partitions": 1},
    )


async def test_worker_exporter_exports_only_its_source_partitions_and_drops_revoked() -> None:
    app = fake_app(
        {
            tp("src-unit", 0),
            tp("src-unit", 3),
            tp("avcc-x-t-changelog", 0),
            tp("avcc-x-__assignor-__leader", 0),
            tp("avcc-x-replies", 0),
        }
    )
    calls: list[tuple[str, list[tuple[str, int]]]] = []

    class Reader:
        def group_offsets(self, group: str, tps: list[tuple[str, int]]) -> list[PartitionOffsets]:
            calls.append((group, list(tps)))
            return [PartitionOffsets(group, t, p, 100, 40) for t, p in tps]

        def close(self) -> None:
            pass

    exporter = WorkerLagExporter(app, "xunit", reader_factory=Reader)  # type: ignore[arg-type]
    await exporter.export_once()
    assert calls == [("avcc-xunit", [("src-unit", 0), ("src-unit", 3)])]
    assert sample("avcc_consumer_lag_messages", group="avcc-xunit", topic="src-unit", partition="3") == 60
    app._consumer._assignment = {tp("src-unit", 0)}  # partition 3 revoked
    await exporter.export_once()
    assert sample("avcc_consumer_lag_messages", group="avcc-xunit", topic="src-unit", partition="3") is None
    exporter.close()
    assert sample("avcc_consumer_lag_messages", group="avcc-xunit", topic="src-unit", partition="0") is None


def test_install_common_views_registers_routes_and_turns_an_idle_consumer_off() -> None:
    idle = faust.App("avcc-unit-idle", broker="kafka://127.0.0.1:1", autodiscover=False)
    state = install_common_views(idle, "unit-idle")
    assert {"/metrics", "/health", "/ready"} <= set(idle.web.views)
    assert install_common_views(idle, "unit-idle") is state  # idempotent
    idle.on_worker_init.send()
    assert state.consumer is False and idle.boot_strategy.enable_kafka_consumer is False

    busy = faust.App("avcc-unit-busy", broker="kafka://127.0.0.1:1", autodiscover=False)

    @busy.agent(busy.topic("unit-busy-topic"))
    async def agent(stream: Any) -> None:
        async for _ in stream:
            pass

    busy_state = install_common_views(busy, "unit-busy", export_lag=False)
    busy.on_worker_init.send()
    assert busy_state.consumer is True and busy.boot_strategy.enable_kafka_consumer is not False


async def test_worker_exporter_follows_a_groups_own_consumer() -> None:
    class Reader:
        def group_offsets(self, group: str, tps: list[tuple[str, int]]) -> list[PartitionOffsets]:
            return [PartitionOffsets(group, t, p, 10, 4) for t, p in tps]

        def close(self) -> None:
            pass

    app = fake_app(None, agents=False)
    exporter = WorkerLagExporter(
        app,
        "ownunit",
        reader_factory=Reader,  # type: ignore[arg-type]
        assignment=lambda: [("own-unit", 2)],
    )
    rows = await exporter.export_once()
    assert [(r.topic, r.partition, r.lag) for r in rows] == [("own-unit", 2, 6)]
    assert sample("avcc_consumer_lag_messages", group="avcc-ownunit", topic="own-unit", partition="2") == 6
    exporter.close()
