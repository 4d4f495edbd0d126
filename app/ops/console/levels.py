"""The overview's service levels: time to code per level over the last hour, and the wait for a person.

Read from the code group's ``GET /v1/avcc/time-to-code`` (every replica added up), judged by the
objectives of :class:`~app.ops.slo.settings.SloSettings` (:mod:`app.ops.slo.report`). Every figure
is also in a ``data-`` attribute, unrounded, for scripts and tests.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from app.ops.console.workbench import ROUTE_REVIEW, age_text, utc_text
from app.ops.slo.report import LevelReport, level_reports
from app.ops.slo.settings import SloSettings

__all__ = ["service_levels_html"]

_e = html.escape


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _data(**values: Any) -> str:
    """``data-`` attributes of the values given (numbers unrounded)."""
    return "".join(
        f" data-{name.replace('_', '-')}='{_e(value if isinstance(value, str) else repr(value))}'"
        for name, value in values.items()
        if value is not None
    )


def _row(report: LevelReport) -> str:
    objective = report.objective
    stage = report.slowest_stage
    budget = report.budget_left
    attributes = _data(
        level=objective.level,
        answered=report.answered,
        in_time=report.in_time,
        p50_s=report.p50_s,
        p99_s=report.p99_s,
        compliance=report.compliance,
        budget_left=budget,
        slowest_stage=stage[0] if stage else None,
    )
    overspent = " class='error'" if budget is not None and budget < 0 else ""
    cells = [
        objective.level,
        f"{objective.objective * 100:g} % within {objective.target_s:g} s",
        str(report.answered),
        _seconds(report.p50_s),
        _seconds(report.p99_s),
        _percent(report.compliance),
    ]
    slowest = f"{stage[0]} (mean {_seconds(stage[1])})" if stage else "—"
    return (
        f"<tr{attributes}>"
        + "".join(f"<td>{_e(cell)}</td>" for cell in cells)
        + f"<td{overspent}>{_e(_percent(budget))}</td><td>{_e(slowest)}</td></tr>"
    )


def _human_wait(answer: Mapping[str, Any], slo: SloSettings, now_ms: int, waiting: int | None) -> str:
    since = answer.get("oldest_need_human_ms")
    link = f"<a href='{ROUTE_REVIEW}'>review workbench</a>"
    works = f"{waiting} works wait" if waiting and waiting > 1 else "1 work waits" if waiting else ""
    oldest = f"{works} for a person; the oldest has waited" if works else "The oldest work has waited"
    if since is None:
        return f"<p id='human-wait' class='muted'>No work waits for a person ({link}).</p>"
    waited_s = max(0, now_ms - int(since)) / 1000
    iso, readable = utc_text(int(since))
    late = waited_s > slo.human_wait_max_s
    return (
        f"<p id='human-wait' class='{'flash error' if late else ''}'{_data(since_ms=int(since))}>"
        f"{_e(oldest)} <b>{_e(age_text(waited_s))}</b>, since "
        f"<time datetime='{iso}'>{_e(readable)}</time> (at most {_e(age_text(slo.human_wait_max_s))}): "
        f"{link}</p>"
    )


def service_levels_html(
    answer: Mapping[str, Any] | None, slo: SloSettings, now_ms: int, waiting: int | None = None
) -> str:
    """The section: one row per level, then the oldest wait for a person with a link to the
    workbench (``waiting``: how many wait, from the records by status)."""
    title = "<h2>Time to code, last hour</h2>"
    if answer is None:
        return f"<section id='service-levels'>{title}<p class='flash error'>unavailable</p></section>"
    rows = "".join(_row(report) for report in level_reports(answer, slo.levels()))
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "level",
            "objective",
            "answered",
            "p50",
            "p99",
            "in time",
            "error budget left",
            "slowest stage",
        )
    )
    note = (
        "<p class='muted'>Works no person decided, by final level, from application to code or refusal; "
        "p50/p99 read off the code group's time-to-code histogram as Prometheus does; the error budget "
        "is the objective's allowance of late answers in this hour.</p>"
    )
    missing = answer.get("missing_partitions") or ()
    unknown = (
        f"<p class='flash error' id='waits-unknown'>the waits of record partitions "
        f"{_e(', '.join(str(int(p)) for p in missing))} are not known (their code replica did not answer)</p>"
        if missing
        else ""
    )
    return (
        f"<section id='service-levels'>{title}<table id='time-to-code'><thead><tr>{head}</tr></thead>"
        f"<tbody>{rows}</tbody></table>{note}{_human_wait(answer, slo, now_ms, waiting)}{unknown}</section>"
    )
