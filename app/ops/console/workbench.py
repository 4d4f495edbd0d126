"""The human review workbench (``/review``): a page of ``need_human`` tasks a reviewer can decide from.

Each task shows what the decision rests on: the work (title, a link to its content, the content
hash), who applied and when (submission time and how long it has waited), the AI tool (model and
version), the AI review (score, level, the rules it hit, the full report) and the approve/reject
form. Tasks are filtered by applicant, AI level and age, oldest first, :data:`PAGE_SIZE` a page;
filters and pages are plain links and a GET form (no script). The review workers do the
filtering and paging (``GET /v1/review/tasks``), so a page costs the same with thousands of tasks.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, get_args
from urllib.parse import parse_qsl, urlencode

import orjson

from app.ops.dlq.pages import page
from schemas.types import FinalLevel

__all__ = [
    "PAGE_SIZE",
    "ROUTE_DECIDE",
    "ROUTE_REVIEW",
    "WAITING",
    "WorkbenchQuery",
    "age_text",
    "utc_text",
    "workbench_html",
]

ROUTE_REVIEW = "/review"
ROUTE_DECIDE = "/review/{avcc_record_id:\\d+}/decision"
#: Tasks a page shows.
PAGE_SIZE: Final = 50
#: The "waiting at least" choices: key -> seconds.
WAITING: Final[Mapping[str, int]] = {"10m": 600, "1h": 3600, "1d": 86_400, "7d": 7 * 86_400}
_WAITING_TEXT: Final = {"": "any time", "10m": "10 minutes", "1h": "1 hour", "1d": "1 day", "7d": "7 days"}
_LEVELS: Final = get_args(FinalLevel)
#: Content links the page makes clickable; any other scheme is shown as text.
_LINKED_SCHEMES: Final = ("https://", "http://", "s3://", "oss://", "ipfs://")
_MAX_TEXT: Final = 128

_e = html.escape


@dataclass(frozen=True, slots=True)
class WorkbenchQuery:
    """The workbench page's filters and position (its own query string)."""

    applicant: str = ""
    level: str = ""
    waiting: str = ""
    after: str = ""

    @classmethod
    def from_mapping(cls, query: Mapping[str, str]) -> WorkbenchQuery:
        """The filters of a query string; unknown choices are dropped, text is cut."""
        level = query.get("level", "")
        waiting = query.get("waiting", "")
        return cls(
            applicant=query.get("applicant", "").strip()[:_MAX_TEXT],
            level=level if level in _LEVELS else "",
            waiting=waiting if waiting in WAITING else "",
            after=query.get("after", "").strip()[:_MAX_TEXT],
        )

    @classmethod
    def from_query_string(cls, text: str) -> WorkbenchQuery:
        """The filters of ``text`` (a form's ``back`` field)."""
        return cls.from_mapping(dict(parse_qsl(text[: 4 * _MAX_TEXT])))

    def filters(self) -> dict[str, str]:
        """The filters that are set, as the page's query parameters (the position left out)."""
        chosen = {"applicant": self.applicant, "level": self.level, "waiting": self.waiting}
        return {name: value for name, value in chosen.items() if value}

    def link(self, *, after: str = "", **extra: str) -> str:
        """The workbench URL of these filters at ``after`` (the first page when empty)."""
        params = {**self.filters(), **({"after": after} if after else {}), **extra}
        return ROUTE_REVIEW + (f"?{urlencode(params)}" if params else "")

    def query_string(self) -> str:
        """Filters and position, to come back to this very page after a decision."""
        return urlencode({**self.filters(), **({"after": self.after} if self.after else {})})

    def tasks_path(self, route: str, now_ms: int) -> str:
        """The review workers' listing of this page (``GET /v1/review/tasks``)."""
        params: dict[str, str | int] = {"status": "need_human", "limit": PAGE_SIZE}
        if self.applicant:
            params["applicant_id"] = self.applicant
        if self.level:
            params["final_level"] = self.level
        if self.waiting:
            params["created_before_ms"] = max(0, now_ms - WAITING[self.waiting] * 1000)
        if self.after:
            params["after"] = self.after
        # ":" unescaped, as the worker reads it back: the request is signed over its path and query
        # as aiohttp presents them, which decodes an escaped ":" (the cursor has one)
        return f"{route}?{urlencode(params, safe=':')}"


def utc_text(ms: int) -> tuple[str, str]:
    """``(ISO 8601, readable)`` of epoch milliseconds, in UTC."""
    at = time.gmtime(ms / 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", at), time.strftime("%Y-%m-%d %H:%M:%S UTC", at)


def age_text(seconds: float) -> str:
    """A wait in whole minutes, hours or days (``14 min``, ``2 h 5 min``, ``3 d 4 h``)."""
    minutes = max(0, int(seconds // 60))
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


def _or_dash(value: Any, css: str) -> str:
    if value is None or value == "":
        return f"<span class='{css} muted'>—</span>"
    return f"<span class='{css}'>{_e(str(value))}</span>"


def _content_link(url: Any) -> str:
    if not isinstance(url, str) or not url:
        return "<span class='content muted'>no content link</span>"
    if url.lower().startswith(_LINKED_SCHEMES):
        return f'<a class="content" href="{_e(url)}" rel="noopener noreferrer" target="_blank">{_e(url)}</a>'
    return f"<span class='content'>{_e(url)}</span>"


def _hits(report: Mapping[str, Any]) -> str:
    """The rules the AI review hit (its flags), then the factors that did not score in full."""
    flags = [str(f) for f in report.get("flags", ()) if f]
    weak = [
        f"{factor.get('name')} {float(factor.get('fraction', 0)):.2f}"
        for factor in report.get("factors", ())
        if isinstance(factor, Mapping) and float(factor.get("fraction", 1)) < 1
    ]
    items = "".join(f"<li class='hit'>{_e(flag)}</li>" for flag in flags)
    items += "".join(f"<li class='factor muted'>{_e(text)}</li>" for text in weak)
    return f"<ul class='hits'>{items or '<li class=muted>no rule hit</li>'}</ul>"


def _task_row(task: Mapping[str, Any], token: str, back: str, now_ms: int) -> str:
    record_id = int(task["avcc_record_id"])
    report = task.get("report") or {}
    report_text = orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    tool = task.get("ai_tool_info") or {}
    submitted = task.get("submitted_ms") or task.get("created_ms")
    if isinstance(submitted, int):
        iso, readable = utc_text(submitted)
        waited = age_text((now_ms - int(task.get("created_ms") or submitted)) / 1000)
        when = f"<time class='submitted' datetime='{iso}'>{readable}</time><br>waiting {_e(waited)}"
    else:
        when = "<span class='muted'>—</span>"
    levels = "".join(f'<option value="{lv}">{lv}</option>' for lv in _LEVELS)
    action = ROUTE_DECIDE.replace("{avcc_record_id:\\d+}", str(record_id))
    work = (
        f"<b>{_or_dash(task.get('title'), 'title')}</b><br>{_content_link(task.get('content_url'))}"
        f"<br>{_or_dash(task.get('content_hash'), 'content-hash')}"
    )
    name, version = (
        _or_dash(tool.get("model_name"), "model-name"),
        _or_dash(tool.get("model_version"), "model-version"),
    )
    model = f"{name}<br>{version}"
    evidence = (
        f"{_hits(report)}<code class='report-hash'>{_e(str(task.get('report_hash')))}</code>"
        f"<details><summary>report (rule hits, scores)</summary><pre>{_e(report_text)}</pre></details>"
    )
    return (
        f'<tr data-record="{record_id}"><td><span class="record">{record_id}</span><br>'
        f"<small>{when}</small></td><td class='work'>{work}</td>"
        f"<td>{_or_dash(task.get('applicant_id'), 'applicant')}</td><td class='model'>{model}</td>"
        f"<td class='n score'>{_e(str(task.get('overall_score')))}</td>"
        f"<td class='level'>{_e(str(task.get('final_level')))}</td><td class='evidence'>{evidence}</td>"
        f'<td><form method="post" action="{action}" class="decide">'
        f'<input type="hidden" name="form_token" value="{_e(token)}">'
        f'<input type="hidden" name="back" value="{_e(back)}">'
        f'<label>level <select name="final_level">{levels}</select></label> '
        f'<label>reason <input name="reason" required maxlength="500"></label> '
        '<button name="decision" value="approve" type="submit">Approve</button> '
        '<button name="decision" value="reject" type="submit">Reject</button></form></td></tr>'
    )


def _filter_form(query: WorkbenchQuery) -> str:
    levels = "".join(
        f'<option value="{lv}"{" selected" if lv == query.level else ""}>{lv or "any"}</option>'
        for lv in ("", *_LEVELS)
    )
    waiting = "".join(
        f'<option value="{key}"{" selected" if key == query.waiting else ""}>{_WAITING_TEXT[key]}</option>'
        for key in ("", *WAITING)
    )
    return (
        f'<form class="filters" id="filters" method="get" action="{ROUTE_REVIEW}">'
        f'<label>Applicant<input name="applicant" value="{_e(query.applicant)}" '
        f'maxlength="{_MAX_TEXT}"></label>'
        f'<label>AI level<select name="level">{levels}</select></label>'
        f'<label>Waiting at least<select name="waiting">{waiting}</select></label>'
        f'<button type="submit">Filter</button> <a href="{ROUTE_REVIEW}">clear</a></form>'
    )


def _pager(query: WorkbenchQuery, listing: Mapping[str, Any], shown: int) -> tuple[str, str]:
    """``(where this page is, links to the first and the next page)``."""
    total, remaining = int(listing.get("total", shown)), int(listing.get("remaining", shown))
    first = total - remaining + 1
    position = (
        f"<p id='position'>Tasks {first} to {first + shown - 1} of {total}, oldest first.</p>"
        if shown
        else f"<p id='position'>No task on this page ({total} in all).</p>"
    )
    links = []
    if query.after:
        links.append(f"<a id='first-page' href='{_e(query.link())}'>« first page</a>")
    if listing.get("next"):
        links.append(f"<a id='next-page' href='{_e(query.link(after=str(listing['next'])))}'>next page »</a>")
    return position, f"<nav class='pager'>{' · '.join(links)}</nav>" if links else ""


def workbench_html(
    listing: Mapping[str, Any] | None,
    token: str,
    user: str,
    query: WorkbenchQuery | None = None,
    *,
    flash: str = "",
    error: str = "",
    now_ms: int | None = None,
) -> str:
    """``GET /review``: the filter form, the page of ``need_human`` tasks and the pager."""
    query = query or WorkbenchQuery()
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    parts = []
    if flash:
        parts.append(f"<p class='flash' id='flash'>{_e(flash)}</p>")
    if error:
        parts.append(f"<p class='flash error' id='error'>{_e(error)}</p>")
    parts.append(_filter_form(query))
    tasks: Sequence[Mapping[str, Any]] = listing["tasks"] if listing is not None else ()
    if listing is None:
        parts.append("<p>The review workers could not be asked for tasks.</p>")
    elif not tasks and not query.filters() and not query.after:
        parts.append("<p id='no-tasks'>No task waits for a human reviewer.</p>")
    else:
        position, pager = _pager(query, listing, len(tasks))
        back = query.query_string()
        parts.append(
            f"{position}<p>Decisions are recorded with your name ({_e(user)}) as reviewer.</p>"
            "<table id='tasks'><thead><tr><th>record, submitted</th><th>work: title, content, hash</th>"
            "<th>applicant</th><th>AI model, version</th><th>score</th><th>AI level</th>"
            "<th>rule hits, report</th><th>decision</th></tr></thead><tbody>"
            + "".join(_task_row(t, token, back, now) for t in tasks)
            + f"</tbody></table>{pager}"
        )
    return page("Human review", "".join(parts), user)
