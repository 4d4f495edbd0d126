"""Lag pages: the ``avcc lag`` table, the ``GET /lag`` HTML page and the ``GET /lag.json`` body."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from app.ops.console.groups import groups_table
from app.ops.console.rates import OffsetHistory
from app.ops.lag.evaluation import STATUS_COLOURS
from app.ops.lag.lifecycle import iso_time
from app.ops.lag.monitor import LagEvaluator, LagReport
from app.ops.lag.reader import OffsetReader
from app.ops.lag.settings import LagSettings
from app.ops.lag.snapshot import BROKER_ERROR
from app.platform.settings import Settings

__all__ = ["format_lag_table", "lag_json", "print_lag_table", "render_lag_html"]


def format_lag_table(report: LagReport) -> str:
    """Plain-text table: group, topic, partition, end, committed, lag, status (then active alerts)."""
    header = ("group", "topic", "partition", "end", "committed", "lag", "status")
    rows: list[tuple[str, ...]] = []
    for topic in report.topics:
        if not topic.partitions:
            rows.append(
                (topic.group, topic.topic or "-", "-", "-", "-", "-", f"{topic.status} {topic.reason}")
            )
        for p in topic.partitions:
            o = p.offsets
            committed = "-" if o.committed is None else str(o.committed)
            rows.append((o.group, o.topic, str(o.partition), str(o.end), committed, str(o.lag), p.status))
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(7)]
    numeric = {2, 3, 4, 5}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(header)]
    out.extend(line(r) for r in rows)
    for group, message in sorted(report.errors.items()):
        out.append(f"error {group}: {message}")
    for state in report.active_alerts:
        out.append(
            f"ALERT {state.rule.name} [{state.rule.severity}] {state.group} {state.topic}: {state.reason}"
        )
        if state.rule.action:
            out.append(f"  -> {state.rule.action}")
    return "\n".join(out)


def render_lag_html(
    report: LagReport | None, *, refresh_s: float = 5.0, history: OffsetHistory | None = None
) -> str:
    """The ``GET /lag`` page: active alerts on top, one row per group (status, total lag, trend
    chart), then every partition folded below (status in colour)."""
    e = html.escape
    head = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='{max(1, int(refresh_s))}'>"
        "<title>AVCC consumer lag</title><style>"
        "body{font-family:system-ui,sans-serif;margin:1.5rem}table{border-collapse:collapse}"
        "th,td{padding:.25rem .6rem;border-bottom:1px solid #ddd;text-align:left}"
        "td.n{text-align:right;font-variant-numeric:tabular-nums}"
        ".s{color:#fff;border-radius:3px;padding:0 .4rem;font-weight:600}"
        ".alert{background:#ffebe9;border:1px solid #d1242f;padding:.5rem;margin:.5rem 0}"
        "</style></head><body><h1>Consumer lag</h1>"
    )
    if report is None:
        return (
            head + "<p id='empty'>No snapshot yet; the monitor takes its first one shortly.</p></body></html>"
        )
    parts = [head, f"<p>Snapshot at <time>{e(iso_time(report.taken_at))}</time></p>"]
    for state in report.active_alerts:
        parts.append(
            f"<div class='alert' data-rule='{e(state.rule.name)}'><b>{e(state.rule.name)}</b> "
            f"[{e(state.rule.severity)}] {e(state.group)} / {e(state.topic)}: {e(state.reason)}"
            f"<br>{e(state.rule.action)}</div>"
        )
    for group, message in sorted(report.errors.items()):
        parts.append(f"<div class='alert'>error {e(group)}: {e(message)}</div>")
    parts.append(groups_table(report, history or OffsetHistory(), link_lag=False))
    parts.append(
        "<details id='partitions'><summary>Partitions</summary>"
        "<table id='lag'><thead><tr><th>group</th><th>topic</th><th>partition</th><th>end</th>"
        "<th>committed</th><th>lag</th><th>status</th></tr></thead><tbody>"
    )
    for topic in report.topics:
        for p in topic.partitions:
            o = p.offsets
            committed = "-" if o.committed is None else str(o.committed)
            parts.append(
                f"<tr data-status='{p.status}'><td>{e(o.group)}</td><td>{e(o.topic)}</td>"
                f"<td class='n'>{o.partition}</td><td class='n'>{o.end}</td><td class='n'>{committed}</td>"
                f"<td class='n'>{o.lag}</td>"
                f"<td><span class='s' style='background:{STATUS_COLOURS[p.status]}' "
                f"title='{e(p.reason)}'>{p.status}</span></td></tr>"
            )
    parts.append("</tbody></table></details></body></html>")
    return "".join(parts)


def print_lag_table(settings: Settings, config: LagSettings | None = None) -> int:
    """``avcc lag``: one snapshot as a table on stdout.

    Exit status: 0 all fine, 1 a rule's threshold is exceeded or a group is STOPped,
    2 the broker could not be read. (One snapshot cannot show WARN/STALL: those need history;
    watch ``GET /lag`` of the ops worker for them.)
    """
    reader = OffsetReader(settings, config)
    try:
        snapshot = reader.snapshot()
    finally:
        reader.close()
    report = LagEvaluator(reader.config).observe(snapshot)
    print(format_lag_table(report))
    if BROKER_ERROR in report.errors:
        return 2
    if report.active_alerts or any(t.status in {"STOP", "ERR"} for t in report.topics):
        return 1
    return 0


def lag_json(report: LagReport | None) -> dict[str, Any]:
    """The ``GET /lag.json`` body: the latest report (``taken_at`` is null before the first snapshot)."""
    if report is None:
        return {"taken_at": None, "groups": [], "alerts": [], "errors": {}}
    return report.as_json()
