"""DLQ console pages: the server-rendered HTML of the list, detail, bulk and error pages, and their paths."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from app.ops.dlq.entries import STATUSES, DlqEntry, iso_ms
from app.ops.dlq.filters import DlqFilter
from app.ops.dlq.reinject import MAX_REINJECTIONS

__all__ = [
    "LIST_LIMIT",
    "ROUTE_BULK",
    "ROUTE_DETAIL",
    "ROUTE_DETAIL_JSON",
    "ROUTE_DISCARD",
    "ROUTE_LIST",
    "ROUTE_LIST_JSON",
    "ROUTE_REINJECT",
    "bulk_html",
    "detail_html",
    "list_html",
    "page",
]


_ID = r"{dlq_id:\d+-\d+(?:-\d+)?}"
ROUTE_LIST = "/dlq"
ROUTE_LIST_JSON = "/dlq.json"
ROUTE_BULK = "/dlq/bulk-reinject"
ROUTE_DETAIL = f"/dlq/{_ID}"
ROUTE_DETAIL_JSON = f"/dlq/{_ID}.json"
ROUTE_REINJECT = f"/dlq/{_ID}/reinject"
ROUTE_DISCARD = f"/dlq/{_ID}/discard"

#: Most rows the list page shows.
LIST_LIMIT = 500

_e = html.escape

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:.7rem 1.5rem;display:flex;justify-content:space-between}
header a{color:#fff;text-decoration:none;font-weight:600}
main{padding:1rem 1.5rem;max-width:1400px}
table{border-collapse:collapse;width:100%;background:#fff;font-size:.9rem}
th,td{border-bottom:1px solid #e2e5ea;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#eef0f3}
pre{background:#fff;border:1px solid #e2e5ea;padding:.7rem;overflow:auto;max-height:30rem;font-size:.85rem}
form.filters{display:flex;flex-wrap:wrap;gap:.5rem;align-items:end;margin-bottom:1rem}
form.filters label{display:flex;flex-direction:column;font-size:.8rem}
.status{padding:.1rem .45rem;border-radius:.6rem;font-size:.8rem;font-weight:600}
.status-new{background:#fde2e1;color:#9b1c1c}
.status-reinjected{background:#def7ec;color:#03543f}
.status-discarded{background:#e5e7eb;color:#374151}
.flash{padding:.6rem .8rem;border-radius:.3rem;background:#def7ec}
.flash.error{background:#fde2e1}
.actions{display:flex;gap:2rem;flex-wrap:wrap;margin:1rem 0}
.actions form{background:#fff;border:1px solid #e2e5ea;padding:.7rem}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}
dl.meta dt{font-weight:600}
dl.meta dd{margin:0;word-break:break-all}
.muted{color:#6b7280}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.lagstatus{color:#fff;border-radius:3px;padding:0 .4rem;font-weight:600}
.cols{display:flex;gap:2rem;flex-wrap:wrap}.cols table{width:auto;min-width:16rem}
li.alert{color:#9b1c1c}form.decide{display:flex;gap:.4rem;flex-wrap:wrap;align-items:center}
ul.hits{margin:0 0 .3rem;padding-left:1rem}li.hit{color:#9b1c1c}
td.work{min-width:16rem;max-width:26rem;word-break:break-all}td.evidence{max-width:20rem;word-break:break-all}
nav.pager{margin:1rem 0;font-weight:600}
.s{color:#fff;border-radius:3px;padding:0 .4rem;font-weight:600}
div.alert{background:#ffebe9;border:1px solid #d1242f;padding:.5rem;margin:.5rem 0}
details.partitions summary{cursor:pointer}details.partitions table{margin:.3rem 0;width:auto}
"""


def page(title: str, body: str, user: str | None = None, *, head: str = "") -> str:
    """A whole console page: header with the operator, ``title`` and ``body`` (trusted HTML);
    ``head`` (trusted) goes into ``<head>`` (the lag page's script)."""
    who = f'<span class="muted">operator: {_e(user)}</span>' if user else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)} · AVCC console</title><style>{_CSS}</style>{head}</head><body>"
        f'<header><nav><a href="/">AVCC console</a> · <a href="/review">review</a> · '
        f'<a href="{ROUTE_LIST}">dead-letter queue</a> · <a href="/lag">lag</a></nav>{who}</header>'
        f"<main><h1>{_e(title)}</h1>{body}</main></body></html>"
    )


def _status(status: str) -> str:
    return f'<span class="status status-{_e(status)}" data-status="{_e(status)}">{_e(status)}</span>'


def _input(name: str, label: str, value: str, options: Iterable[str] = (), kind: str = "text") -> str:
    datalist = ""
    attrs = ""
    options = list(options)
    if options:
        datalist = f'<datalist id="dl-{name}">' + "".join(f'<option value="{_e(o)}">' for o in options)
        datalist += "</datalist>"
        attrs = f' list="dl-{name}"'
    return (
        f'<label>{_e(label)}<input type="{kind}" name="{name}" value="{_e(value)}"{attrs}></label>{datalist}'
    )


def list_html(
    entries: list[DlqEntry],
    filters: DlqFilter,
    query: Mapping[str, str],
    counts: Mapping[str, int],
    facets: Mapping[str, list[str]],
    user: str,
) -> str:
    """``GET /dlq``: the filter form, totals, the bulk re-inject form when filtered, the table."""
    q = {k: query.get(k, "") for k in ("topic", "group", "error_class", "status", "since", "until")}
    status_options = "".join(
        f'<option value="{s}"{" selected" if q["status"] == s else ""}>{s}</option>' for s in ("", *STATUSES)
    )
    form = (
        f'<form class="filters" method="get" action="{ROUTE_LIST}">'
        + _input("topic", "Topic", q["topic"], facets.get("topic", ()))
        + _input("group", "Group", q["group"], facets.get("group", ()))
        + _input("error_class", "Error class", q["error_class"], facets.get("error_class", ()))
        + f'<label>Status<select name="status">{status_options}</select></label>'
        + _input("since", "Failed since (UTC)", q["since"], kind="datetime-local")
        + _input("until", "Failed until (UTC)", q["until"], kind="datetime-local")
        + '<button type="submit">Filter</button>'
        + f'<a href="{ROUTE_LIST}">reset</a></form>'
    )
    totals = ", ".join(f"{_e(k)}: {v}" for k, v in counts.items())
    rows = []
    for e in entries:
        s = e.summary()
        rows.append(
            "<tr>"
            f'<td><a class="dlq-link" href="/dlq/{_e(e.dlq_id)}">{_e(e.dlq_id)}</a></td>'
            f"<td>{_status(e.status)}</td>"
            f"<td>{_e(s['failed_at'])}</td>"
            f"<td>{_e(e.original_topic)}</td>"
            f"<td>{_e(e.consumer_group)}</td>"
            f'<td title="{_e(e.error_class)}">{_e(e.error_class.rsplit(".", 1)[-1])}</td>'
            f"<td>{_e(s['error_message'][:120])}</td>"
            f"<td>{_e(e.event_id or '')}</td>"
            f"<td>{_e(str(s['attempt'] or ''))}</td>"
            f"<td>{e.reinjected_count}</td>"
            "</tr>"
        )
    table = (
        '<table id="dlq-table"><thead><tr><th>id</th><th>status</th><th>failed at (UTC)</th><th>topic</th>'
        "<th>group</th><th>error</th><th>message</th><th>event id</th><th>attempts</th>"
        "<th>re-injected</th></tr></thead><tbody>"
        + ("".join(rows) or '<tr><td colspan="10" class="muted">no dead letters match</td></tr>')
        + "</tbody></table>"
    )
    bulk = ""
    active = {k: v for k, v in q.items() if v and k != "status"}
    if active:
        hidden = "".join(f'<input type="hidden" name="{_e(k)}" value="{_e(v)}">' for k, v in active.items())
        new_count = sum(1 for e in entries if e.status == "new")
        bulk = (
            f'<div class="actions"><form method="post" action="{ROUTE_BULK}">{hidden}'
            f"<strong>Bulk re-inject</strong> the new messages matching "
            f"{_e(', '.join(f'{k}={v}' for k, v in active.items()))} ({new_count} shown) "
            '<label><input type="checkbox" name="confirm" value="yes" required> confirm</label> '
            '<input type="text" name="reason" placeholder="reason (optional)"> '
            '<button type="submit">Re-inject all</button></form></div>'
        )
    shown = f"{len(entries)} shown" + (f" (first {LIST_LIMIT})" if len(entries) >= LIST_LIMIT else "")
    body = form + f'<p class="muted">{shown}. Totals: {totals}.</p>' + bulk + table
    return page("Dead letters", body, user)


def _dl(items: Iterable[tuple[str, str]]) -> str:
    return '<dl class="meta">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items) + "</dl>"


def detail_html(
    entry: DlqEntry,
    reinjections: int,
    max_reinjections: int = MAX_REINJECTIONS,
    *,
    flash: str | None = None,
    error: str | None = None,
    user: str | None = None,
) -> str:
    """``GET /dlq/{id}``: actions, failure metadata, headers, payload, stack trace, audit trail."""
    meta = entry.metadata
    d = entry.detail()
    parts: list[str] = []
    if flash in {"reinjected", "discarded"}:
        parts.append(f'<p class="flash" id="flash">Message {_e(flash)}.</p>')
    if error:
        parts.append(f'<p class="flash error" id="error">{_e(error)}</p>')
    parts.append(f'<p>Status: <strong id="status">{_status(entry.status)}</strong></p>')
    left = max(0, max_reinjections - reinjections)
    reinject_disabled = " disabled" if left == 0 or meta is None else ""
    discard_form = ""
    if entry.status == "new":
        discard_form = (
            f'<form method="post" action="/dlq/{_e(entry.dlq_id)}/discard">'
            '<input type="text" name="reason" placeholder="reason (required)" required> '
            '<button type="submit" id="discard">Discard</button></form>'
        )
    parts.append(
        '<div class="actions">'
        f'<form method="post" action="/dlq/{_e(entry.dlq_id)}/reinject">'
        '<input type="text" name="reason" placeholder="note (optional)"> '
        f'<button type="submit" id="reinject"{reinject_disabled}>Re-inject</button> '
        f'<span class="muted">into {_e(entry.original_topic or "?")}; {left} of {max_reinjections} '
        "re-injections left</span></form>"
        f"{discard_form}</div>"
    )
    summary = [
        ("original topic", entry.original_topic),
        (
            "original partition / offset",
            f"{meta.original_partition} / {meta.original_offset}" if meta else "",
        ),
        ("consumer group", entry.consumer_group),
        ("error class", entry.error_class),
        ("error message", meta.error_message if meta else (entry.metadata_error or "")),
        ("event id", entry.event_id or ""),
        (
            "key",
            d["key"]
            if d["key"] is not None
            else ("(none)" if entry.key is None else f"base64:{d['key_b64']}"),
        ),
        ("attempts", str(meta.attempt) if meta else ""),
        ("first failure (UTC)", iso_ms(meta.first_failure_ms) if meta else ""),
        ("dead-lettered (UTC)", iso_ms(entry.failed_at_ms)),
        ("original timestamp (UTC)", iso_ms(meta.original_timestamp_ms) if meta else ""),
        ("DLQ position", f"partition {entry.partition}, offset {entry.offset}"),
        ("re-injected", f"{entry.reinjected_count} time(s) from this entry; {reinjections} for the event"),
    ]
    parts.append("<h2>Failure</h2>" + _dl(summary))
    if entry.metadata_error:
        parts.append(f'<p class="flash error">Failure metadata unusable: {_e(entry.metadata_error)}</p>')
    header_rows = "".join(
        f"<tr><td>{_e(h['name'])}</td><td>{_header_text(h)}</td></tr>" for h in d["headers"]
    )
    parts.append(
        "<h2>Headers</h2><table><thead><tr><th>name</th><th>value</th></tr></thead><tbody>"
        + (header_rows or '<tr><td colspan="2" class="muted">none</td></tr>')
        + "</tbody></table>"
    )
    parts.append(
        f'<h2>Payload <span class="muted">({_e(d["payload_kind"])})</span></h2>'
        f'<pre id="payload">{_e(d["payload"])}</pre>'
    )
    if d["stacktrace"]:
        parts.append(f'<h2>Stack trace</h2><pre id="stacktrace">{_e(d["stacktrace"])}</pre>')
    audit_rows = "".join(
        f"<tr><td>{_e(a['at'])}</td><td>{_e(a['who'])}</td><td>{_e(a['action'])}</td>"
        f"<td>{_e(a['reason'] or '')}</td><td>{_e(a['detail'] or '')}</td></tr>"
        for a in d["audit"]
    )
    parts.append(
        '<h2>Audit trail</h2><table id="audit"><thead><tr><th>when (UTC)</th><th>who</th><th>action</th>'
        "<th>reason</th><th>detail</th></tr></thead><tbody>"
        + (audit_rows or '<tr><td colspan="5" class="muted">no actions yet</td></tr>')
        + "</tbody></table>"
    )
    return page(f"Dead letter {entry.dlq_id}", "".join(parts), user)


def _header_text(header: Mapping[str, Any]) -> str:
    if header["value"] is not None:
        return _e(header["value"])
    return "base64:" + _e(header["value_b64"])


def bulk_html(reinjected: list[str], refused: Mapping[str, str], filters: DlqFilter) -> str:
    """The result page of a bulk re-injection: what was re-injected, what was refused and why."""
    kept = {k: v for k, v in filters.as_dict().items() if k in ("topic", "group", "error_class")}
    back = f"{ROUTE_LIST}?{urlencode(kept)}"
    items = "".join(f'<li><a href="/dlq/{_e(i)}">{_e(i)}</a></li>' for i in reinjected)
    refused_items = "".join(
        f'<li><a href="/dlq/{_e(i)}">{_e(i)}</a>: {_e(m)}</li>' for i, m in refused.items()
    )
    body = (
        f'<p class="flash" id="flash">Re-injected {len(reinjected)} message(s); refused {len(refused)}.</p>'
        f"<ul>{items}</ul>"
        + (f"<h2>Refused</h2><ul>{refused_items}</ul>" if refused else "")
        + f'<p><a href="{_e(back)}">Back to the list</a></p>'
    )
    return page("Bulk re-injection", body)
