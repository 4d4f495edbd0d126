"""Lag monitor output: Alertmanager payload, exported metrics, alert sinks, table and HTML page."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import datetime

import pytest

from app.ops.alerts import Alert
from app.ops.lag import pages as lag_pages
from app.ops.lag.lifecycle import AlertEvent, alertmanager_payload
from app.ops.lag.monitor import LagEvaluator, LagMonitor
from app.ops.lag.pages import format_lag_table, render_lag_html
from app.platform.lag.reader import OffsetReader
from app.platform.lag.snapshot import BROKER_ERROR, LagSnapshot
from app.platform.settings import Settings
from tests.unit.ops.lag.lag_samples import GROUP, T0, TOPIC, config, one, rule, sample, snap

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
    def __init__(self, snapshots: list[LagSnapshot], request_timeout_s: float = 10.0) -> None:
        self.snapshots = snapshots
        self.request_timeout_s = request_timeout_s
        self.closed = False
        self.aborted = False

    def snapshot(self) -> LagSnapshot:
        return self.snapshots.pop(0)

    def abort(self) -> None:
        self.aborted = True

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


async def test_a_snapshot_that_never_answers_reports_a_broker_error_and_a_fresh_reader_takes_over() -> None:
    """A monitor waiting for ever on one snapshot would stop every lag alert (seen: a reader's
    committed() lookup that never returned after an Apache Kafka restart)."""
    group, topic = "g-hang-unit", "t-hang-unit"
    release = threading.Event()

    class HangingReader(FakeReader):
        def snapshot(self) -> LagSnapshot:
            release.wait(10)
            return super().snapshot()

    stuck = HangingReader([snap(0, [(0, 10, 10)], group=group, topic=topic)], request_timeout_s=0.05)
    fresh = FakeReader([snap(5, [(0, 1500, 0)], group=group, topic=topic)], request_timeout_s=0.05)
    cfg = config(rule(topic=topic, groups=(group,), not_shrinking_s=None))
    monitor = LagMonitor(
        Settings(),
        cfg,
        reader=stuck,  # type: ignore[arg-type]
        reader_factory=lambda: fresh,  # type: ignore[arg-type,return-value]
        sinks=[FakeSink()],
    )
    report = await asyncio.wait_for(monitor.tick(), 2)
    assert BROKER_ERROR in report.errors
    assert monitor.reader is fresh and not stuck.closed
    assert stuck.aborted and not fresh.aborted, "the stuck read is told to stop at its next request"
    await asyncio.wait_for(monitor.tick(), 2)
    assert sample("avcc_consumer_lag_messages", group=group, topic=topic, partition="0") == 1500
    release.set()
    for _ in range(100):
        if stuck.closed:
            break
        await asyncio.sleep(0.02)
    assert stuck.closed and not fresh.closed


# ----------------------------------------------------------------------------- presentation


def test_table_and_html_show_every_partition_and_the_alert() -> None:
    ev = LagEvaluator(config(rule(not_shrinking_s=None)))
    report = ev.observe(snap(0, [(0, 1500, None), (1, 20, 10)], group="g<x>"))
    text = format_lag_table(report)
    lines = text.splitlines()
    assert lines[0].split() == ["group", "topic", "partition", "end", "committed", "lag", "status"]
    assert lines[1].split() == ["g<x>", TOPIC, "0", "1500", "-", "1500", "OK"]
    page = render_lag_html(report, refresh_s=2, user="ops")
    assert "<td>g&lt;x&gt;</td>" in page and "g<x>" not in page
    assert page.count("<tr data-status=") == 2
    assert "No snapshot yet" in render_lag_html(None)


def test_lag_page_is_a_live_console_page() -> None:
    """Issue 26: the lag page reloaded itself (meta refresh), losing what the operator unfolded,
    outside the console's layout. It is a console page now, its partitions fold under each group
    row, and the console's script swaps ``#live`` in place (a reload only without JavaScript)."""
    ev = LagEvaluator(config(rule(not_shrinking_s=None)))
    report = ev.observe(snap(0, [(0, 1500, None), (1, 20, 10)], group="avcc-code"))
    page = render_lag_html(report, refresh_s=2, user="ops")
    assert "<title>Consumer lag · AVCC console</title>" in page and '<a href="/review">review</a>' in page
    assert "operator: ops" in page
    assert '<script src="/console/live.js" defer></script>' in page
    assert '<noscript><meta http-equiv="refresh" content="2"></noscript>' in page
    assert page.count("http-equiv") == 1  # no reload when the script runs
    assert "<div id='live' data-live-ms='2000'>" in page and "<time id='taken-at'" in page
    row = page[page.index('<tr id="group-avcc-code"') :]
    assert row.index("<details class='partitions' id='partitions-avcc-code'") < row.index("</tr>")
    assert "<script>" not in page and "onclick" not in page  # nothing inline: the CSP allows none


def test_the_console_script_is_served_as_javascript() -> None:
    from app.ops.console.live import LIVE_SCRIPT, LIVE_SCRIPT_ROUTE

    assert LIVE_SCRIPT_ROUTE == "/console/live.js"
    assert b'getElementById("live")' in LIVE_SCRIPT and b"twin.open = details.open" in LIVE_SCRIPT
    assert b"eval(" not in LIVE_SCRIPT and b"innerHTML" not in LIVE_SCRIPT


def test_print_lag_table_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshots = [one(0, 10, 10), one(0, 5000, 0), LagSnapshot(T0, errors={BROKER_ERROR: "down"})]
    monkeypatch.setattr(OffsetReader, "snapshot", lambda self: snapshots.pop(0))
    cfg = config(rule(not_shrinking_s=None))
    assert lag_pages.print_lag_table(Settings(), cfg) == 0
    assert lag_pages.print_lag_table(Settings(), cfg) == 1
    assert "ALERT ApplyLag" in capsys.readouterr().out
    assert lag_pages.print_lag_table(Settings(), cfg) == 2
