"""One row per consumer group: worst status, total lag, consume rate and a lag trend chart.

Shared by the overview (``/``) and the top of the lag page (``/lag``).
"""

from __future__ import annotations

import html

from app.ops.console.charts import sparkline
from app.ops.console.rates import OffsetHistory
from app.ops.lag.evaluation import STATUS_COLOURS, STATUS_ORDER, Status
from app.ops.lag.monitor import LagReport

__all__ = ["groups_table", "rate_text", "status_badge"]

_e = html.escape


def status_badge(status: Status) -> str:
    """A Burrow-style status in its colour."""
    return (
        f'<span class="lagstatus" data-status="{status}" style="color:#fff;border-radius:3px;'
        f'padding:0 .4rem;font-weight:600;background:{STATUS_COLOURS[status]}">{status}</span>'
    )


def rate_text(value: float | None) -> str:
    """A per-second rate as the pages show it (``-`` when unknown)."""
    return "-" if value is None else f"{value:.1f}/s"


def groups_table(report: LagReport, history: OffsetHistory, *, link_lag: bool = True) -> str:
    """``<table id="groups">``: group, status, lag, consumed per second, lag over the last minutes."""
    worst: dict[str, Status] = {}
    lag: dict[str, int] = {}
    for t in report.topics:
        if STATUS_ORDER[t.status] >= STATUS_ORDER[worst.get(t.group, "OK")]:
            worst[t.group] = t.status
        lag[t.group] = lag.get(t.group, 0) + t.lag
    rows = []
    for group in sorted(worst):
        name = f'<a href="/lag#group-{_e(group)}">{_e(group)}</a>' if link_lag else _e(group)
        trend = list(history.group_lags.get(group, ()))
        rows.append(
            f'<tr id="group-{_e(group)}" data-group="{_e(group)}" data-status="{worst[group]}">'
            f"<td>{name}</td><td>{status_badge(worst[group])}</td><td class='n'>{lag[group]}</td>"
            f"<td class='n'>{rate_text(history.rate(history.group_commits.get(group)))}</td>"
            f"<td>{sparkline(trend, label=f'{group} lag', colour='#d1242f')}</td></tr>"
        )
    return (
        "<h2>Consumer groups</h2><table id='groups'><thead><tr><th>group</th><th>status</th>"
        "<th>lag</th><th>consumed</th><th>lag, last minutes</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
