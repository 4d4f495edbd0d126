"""One row per consumer group: worst status, total lag, consume rate and a lag trend chart.

Shared by the overview (``/``) and the lag page (``/lag``), where each row also unfolds the
group's partitions.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from app.ops.console.charts import sparkline
from app.ops.console.rates import OffsetHistory
from app.ops.lag.evaluation import STATUS_COLOURS, STATUS_ORDER, PartitionStatus, Status
from app.ops.lag.monitor import LagReport

__all__ = ["groups_table", "partitions_details", "rate_text", "status_badge"]

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


def partitions_details(group: str, partitions: Sequence[PartitionStatus]) -> str:
    """A group's partitions folded in a ``<details>`` (id ``partitions-<group>``, so a page that
    updates itself can keep it unfolded): topic, partition, end, committed, lag, status."""
    rows = []
    for p in partitions:
        o = p.offsets
        committed = "-" if o.committed is None else str(o.committed)
        rows.append(
            f"<tr data-status='{p.status}' data-topic='{_e(o.topic)}' data-partition='{o.partition}'>"
            f"<td>{_e(o.topic)}</td><td class='n'>{o.partition}</td><td class='n'>{o.end}</td>"
            f"<td class='n'>{committed}</td><td class='n lag'>{o.lag}</td>"
            f"<td><span class='s' style='background:{STATUS_COLOURS[p.status]}' "
            f"title='{_e(p.reason)}'>{p.status}</span></td></tr>"
        )
    return (
        f"<details class='partitions' id='partitions-{_e(group)}' data-group='{_e(group)}'>"
        f"<summary>{len(partitions)} partitions</summary><table class='lag'><thead><tr><th>topic</th>"
        "<th>partition</th><th>end</th><th>committed</th><th>lag</th><th>status</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></details>"
    )


def groups_table(
    report: LagReport, history: OffsetHistory, *, link_lag: bool = True, partitions: bool = False
) -> str:
    """``<table id="groups">``: group, status, lag, consumed per second, lag over the last minutes;
    with ``partitions``, a last cell unfolding the group's partitions (the lag page)."""
    worst: dict[str, Status] = {}
    lag: dict[str, int] = {}
    held: dict[str, list[PartitionStatus]] = {}
    for t in report.topics:
        if STATUS_ORDER[t.status] >= STATUS_ORDER[worst.get(t.group, "OK")]:
            worst[t.group] = t.status
        lag[t.group] = lag.get(t.group, 0) + t.lag
        held.setdefault(t.group, []).extend(t.partitions)
    rows = []
    for group in sorted(worst):
        name = f'<a href="/lag#group-{_e(group)}">{_e(group)}</a>' if link_lag else _e(group)
        trend = list(history.group_lags.get(group, ()))
        folded = f"<td>{partitions_details(group, held[group])}</td>" if partitions else ""
        rows.append(
            f'<tr id="group-{_e(group)}" data-group="{_e(group)}" data-status="{worst[group]}">'
            f"<td>{name}</td><td>{status_badge(worst[group])}</td><td class='n'>{lag[group]}</td>"
            f"<td class='n'>{rate_text(history.rate(history.group_commits.get(group)))}</td>"
            f"<td>{sparkline(trend, label=f'{group} lag', colour='#d1242f')}</td>{folded}</tr>"
        )
    unfold = "<th>partitions</th>" if partitions else ""
    return (
        "<h2>Consumer groups</h2><table id='groups'><thead><tr><th>group</th><th>status</th>"
        f"<th>lag</th><th>consumed</th><th>lag, last minutes</th>{unfold}</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
