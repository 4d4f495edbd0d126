"""Console HTML: the overview (home page); the workbench is :mod:`app.ops.console.workbench`.

Server-rendered, readable without JavaScript; charts are inline SVG (:mod:`app.ops.console.charts`).
Every value from a worker, a record or a report is escaped.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.ops.console.charts import sparkline
from app.ops.console.groups import groups_table, rate_text
from app.ops.console.levels import service_levels_html
from app.ops.console.rates import OffsetHistory, rate_series
from app.ops.console.workbench import ROUTE_REVIEW
from app.ops.console.workers import WorkerReadiness, workers_html
from app.ops.dlq.entries import STATUSES as DLQ_STATUSES
from app.ops.dlq.pages import ROUTE_LIST as ROUTE_DLQ
from app.ops.dlq.pages import page
from app.ops.lag.monitor import LagReport
from app.ops.slo.settings import SloSettings, get_slo_settings

__all__ = ["RECORD_STATUSES", "ROUTE_HOME", "Overview", "overview_html"]

ROUTE_HOME = "/"
#: The record statuses the overview always lists (others the code workers report are added).
RECORD_STATUSES = ("submitted", "need_human", "approved", "issued", "rejected", "chain_failed")

_e = html.escape


@dataclass(frozen=True, slots=True)
class Overview:
    """What the home page shows; a part that could not be fetched carries its error instead."""

    report: LagReport | None
    history: OffsetHistory
    dlq_counts: Mapping[str, int] | None
    records: Mapping[str, int] | None
    anomalies: Sequence[Mapping[str, Any]] = ()
    errors: Mapping[str, str] = field(default_factory=dict)
    #: The code replicas behind ``records`` (``url``, ``partitions``, ``answered``, ``error``).
    record_replicas: Sequence[Mapping[str, Any]] = ()
    #: Record partitions no replica counted (a silent replica's, or ones without an owner yet).
    missing_partitions: Sequence[int] = ()
    #: The code group's last hour (``GET /v1/avcc/time-to-code``), judged by ``objectives``.
    time_to_code: Mapping[str, Any] | None = None
    objectives: SloSettings = field(default_factory=get_slo_settings)
    #: The readiness of every worker of the groups with local state (a recovering one says how far).
    workers: Sequence[WorkerReadiness] = ()
    now_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)


def _topics(history: OffsetHistory) -> str:
    rows = []
    for topic in sorted(history.topic_ends):
        series = history.topic_ends[topic]
        rows.append(
            f'<tr data-topic="{_e(topic)}"><td><a href="{ROUTE_DLQ}?topic={_e(topic)}">{_e(topic)}</a></td>'
            f"<td class='n'>{int(series[-1][1])}</td><td class='n'>{rate_text(history.rate(series))}</td>"
            f"<td>{sparkline(rate_series(series), label=f'{topic} events/s')}</td></tr>"
        )
    return (
        "<h2>Topics</h2><table id='topics'><thead><tr><th>topic</th><th>messages</th>"
        "<th>produced</th><th>events/s, last minutes</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _link(href: str | None, text: str) -> str:
    return f'<a href="{_e(href)}">{_e(text)}</a>' if href else _e(text)


def _counts(
    table_id: str,
    title: str,
    counts: Mapping[str, int] | None,
    order: Sequence[str],
    links: Mapping[str, str],
) -> str:
    """A status -> count table; a status with an entry in ``links`` links to that page."""
    if counts is None:
        missing = f"<p class='flash error' id='{table_id}-error'>unavailable</p>"
        return f"<section><h2>{_e(title)}</h2>{missing}</section>"
    names = [*order, *sorted(k for k in counts if k not in order)]
    cells = "".join(
        f'<tr data-status="{_e(n)}"><td>{_link(links.get(n), n)}</td>'
        f"<td class='n'>{counts.get(n, 0)}</td></tr>"
        for n in names
    )
    return f"<section><h2>{_e(title)}</h2><table id='{table_id}'><tbody>{cells}</tbody></table></section>"


def _numbers(values: Iterable[Any]) -> str:
    return ", ".join(str(int(v)) for v in values)


def _record_sources(overview: Overview) -> str:
    """Under records by status: which code replicas answered for which partitions, and each one
    that did not, with the partitions whose records are therefore not counted."""
    if overview.records is None:
        return ""
    parts = []
    answered = [r for r in overview.record_replicas if r.get("answered")]
    silent = [r for r in overview.record_replicas if not r.get("answered")]
    for replica in silent:
        held = _numbers(replica.get("partitions", ()))
        reason = f" ({replica['error']})" if replica.get("error") else ""
        parts.append(
            f"<p class='flash error replica-missing' data-replica='{_e(str(replica.get('url')))}' "
            f"data-partitions='{_e(held)}'>code replica {_e(str(replica.get('url')))} did not "
            f"answer{_e(reason)}: the records of its partitions {_e(held)} are not counted</p>"
        )
    held_by_silent = {int(p) for r in silent for p in r.get("partitions", ())}
    unowned = [p for p in overview.missing_partitions if int(p) not in held_by_silent]
    if unowned:
        parts.append(
            f"<p class='flash error' id='records-unowned' data-partitions='{_numbers(unowned)}'>"
            f"partitions {_numbers(unowned)} have no owner yet (the code group is rebalancing): "
            "their records are not counted</p>"
        )
    if answered:
        sources = "; ".join(
            f"{_e(str(r.get('url')))} ({_numbers(r.get('partitions', ()))})" for r in answered
        )
        parts.append(f"<p class='muted' id='records-sources'>Counted by {sources}.</p>")
    return "".join(parts)


def _anomalies(overview: Overview) -> str:
    items = []
    for state in overview.report.active_alerts if overview.report else ():
        items.append(
            f"<li class='alert'><b>{_e(state.rule.name)}</b> [{_e(state.rule.severity)}] "
            f"{_e(state.group)} / {_e(state.topic)}: {_e(state.reason)}</li>"
        )
    for a in overview.anomalies:
        text = ", ".join(f"{k}={v}" for k, v in a.items() if not isinstance(v, dict | list))
        items.append(f"<li class='anomaly'>{_e(text)}</li>")
    body = "".join(items) or "<li class='muted'>none</li>"
    return f"<h2>Recent anomalies and alerts</h2><ul id='anomalies'>{body}</ul>"


def overview_html(overview: Overview, user: str) -> str:
    """``GET /``: time to code per level and the wait for a person; groups and topics with status,
    lag, rates and charts; records, DLQ, anomalies."""
    parts = [
        "<p class='muted'>Charts are drawn on the server (SVG) from the lag monitor's offset history; "
        "rates are averages over the last minute.</p>"
    ]
    for what, message in sorted(overview.errors.items()):
        parts.append(f"<p class='flash error' data-part='{_e(what)}'>{_e(what)}: {_e(message)}</p>")
    waiting = overview.records.get("need_human", 0) if overview.records is not None else None
    parts.append(service_levels_html(overview.time_to_code, overview.objectives, overview.now_ms, waiting))
    if overview.report is None:
        parts.append("<p id='no-snapshot'>No lag snapshot yet; the monitor takes its first one shortly.</p>")
    else:
        parts.append(groups_table(overview.report, overview.history))
    if overview.workers:
        parts.append(workers_html(overview.workers))
    parts.append(_topics(overview.history))
    parts.append("<div class='cols'>")
    review = {"need_human": ROUTE_REVIEW}
    records = _counts("records", "Records by status", overview.records, RECORD_STATUSES, review)
    parts.append(records.removesuffix("</section>") + _record_sources(overview) + "</section>")
    dlq_links: dict[str, str] = {s: f"{ROUTE_DLQ}?status={s}" for s in DLQ_STATUSES}
    parts.append(_counts("dlq", "Dead letters by status", overview.dlq_counts, DLQ_STATUSES, dlq_links))
    parts.append("</div>")
    parts.append(_anomalies(overview))
    return page("Pipeline overview", "".join(parts), user)
