"""Lag pages: the ``avcc lag`` table, the ``GET /lag`` console page and the ``GET /lag.json`` body."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from app.ops.console.groups import groups_table
from app.ops.console.live import LIVE_SCRIPT_ROUTE
from app.ops.console.rates import OffsetHistory
from app.ops.dlq.pages import page
from app.ops.lag.lifecycle import iso_time
from app.ops.lag.monitor import LagEvaluator, LagReport
from app.ops.lag.settings import LagSettings, get_lag_settings
from app.platform.lag.reader import OffsetReader
from app.platform.lag.snapshot import BROKER_ERROR
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


def _live_part(report: LagReport | None, history: OffsetHistory) -> str:
    """What the lag page updates in place: snapshot time, alerts, errors, the groups table."""
    e = html.escape
    if report is None:
        return "<p id='empty'>No snapshot yet; the monitor takes its first one shortly.</p>"
    taken = iso_time(report.taken_at)
    parts = [f"<p>Snapshot at <time id='taken-at' datetime='{e(taken)}'>{e(taken)}</time></p>"]
    for state in report.active_alerts:
        parts.append(
            f"<div class='alert' data-rule='{e(state.rule.name)}'><b>{e(state.rule.name)}</b> "
            f"[{e(state.rule.severity)}] {e(state.group)} / {e(state.topic)}: {e(state.reason)}"
            f"<br>{e(state.rule.action)}</div>"
        )
    for group, message in sorted(report.errors.items()):
        parts.append(f"<div class='alert'>error {e(group)}: {e(message)}</div>")
    parts.append(groups_table(report, history, link_lag=False, partitions=True))
    return "".join(parts)


def render_lag_html(
    report: LagReport | None,
    *,
    refresh_s: float = 5.0,
    history: OffsetHistory | None = None,
    user: str | None = None,
) -> str:
    """The ``GET /lag`` page, in the console's layout: active alerts on top, one row per group
    (status, total lag, trend chart) whose partitions unfold in place. Its live part
    (``#live``) is fetched again every ``refresh_s`` by the console's one script
    (:data:`~app.ops.console.live.LIVE_SCRIPT_ROUTE`) and swapped in place, keeping what the
    operator unfolded; without JavaScript the page reloads itself instead."""
    every_ms = max(1000, int(refresh_s * 1000))
    head = (
        f'<script src="{LIVE_SCRIPT_ROUTE}" defer></script>'
        f'<noscript><meta http-equiv="refresh" content="{max(1, round(refresh_s))}"></noscript>'
    )
    body = (
        f"<p class='muted' id='live-status'>Updated in place every {every_ms / 1000:g} s; "
        "what you unfold stays unfolded.</p>"
        f"<div id='live' data-live-ms='{every_ms}'>{_live_part(report, history or OffsetHistory())}</div>"
    )
    return page("Consumer lag", body, user, head=head)


def print_lag_table(settings: Settings, config: LagSettings | None = None) -> int:
    """``avcc lag``: one snapshot as a table on stdout.

    Exit status: 0 all fine, 1 a rule's threshold is exceeded or a group is STOPped,
    2 the broker could not be read. (One snapshot cannot show WARN/STALL: those need history;
    watch ``GET /lag`` of the ops worker for them.)
    """
    config = config if config is not None else get_lag_settings()
    reader = OffsetReader(settings, watched=config.watched())
    try:
        snapshot = reader.snapshot()
    finally:
        reader.close()
    report = LagEvaluator(config).observe(snapshot)
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
