"""The operator page ``/records``: the most recently updated records a code worker holds.

A worker may hold millions of records, and the page is served on the worker's event loop, which
also runs the record agents. So the scan is bounded and cooperative: it reads at most
:data:`SCAN_LIMIT` stored values, hands the loop back every :data:`SLICE` values, looks only at
``updated_ms`` of each raw JSON value and builds a model for the :data:`SHOWN` winners alone.
"""

from __future__ import annotations

import asyncio
import heapq
import html
import time
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Final

import orjson

from app.lifecycle.code.records import RecordState

__all__ = [
    "SCAN_LIMIT",
    "SHOWN",
    "RecentRecords",
    "recent_records",
    "render_recent_records",
]

#: Rows the page shows.
SHOWN: Final = 200
#: Stored values read at most per request.
SCAN_LIMIT: Final = 50_000
#: Values read between two yields to the event loop.
SLICE: Final = 500


@dataclass(frozen=True, slots=True)
class RecentRecords:
    """The newest records of a scan, newest first, and how the scan went."""

    records: list[RecordState]
    scanned: int
    truncated: bool


def _updated_ms(raw: bytes) -> int:
    try:
        value = orjson.loads(raw).get("updated_ms")
    except (orjson.JSONDecodeError, AttributeError):
        return -1
    return value if isinstance(value, int) else 0


async def recent_records(
    raw_values: Iterable[bytes], *, shown: int = SHOWN, scan_limit: int = SCAN_LIMIT, slice_size: int = SLICE
) -> RecentRecords:
    """The ``shown`` most recently updated of the first ``scan_limit`` stored values (raw
    :class:`RecordState` JSON), yielding to the event loop every ``slice_size`` values."""
    values = iter(raw_values)
    newest: list[tuple[int, int, bytes]] = []
    scanned = 0
    while scanned < scan_limit:
        chunk = list(islice(values, min(slice_size, scan_limit - scanned)))
        if not chunk:
            break
        for raw in chunk:
            scanned += 1
            if raw:
                entry = (_updated_ms(raw), scanned, raw)
                if len(newest) < shown:
                    heapq.heappush(newest, entry)
                else:
                    heapq.heappushpop(newest, entry)
        await asyncio.sleep(0)
    truncated = scanned >= scan_limit and next(values, None) is not None
    states = []
    for _, _, raw in sorted(newest, reverse=True):
        try:
            states.append(RecordState.model_validate_json(raw))
        except ValueError:  # a value this version cannot read: leave it off the page
            continue
    return RecentRecords(states, scanned, truncated)


def _row(s: RecordState) -> str:
    updated = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime((s.updated_ms or 0) / 1000))
    cells = [
        str(s.avcc_record_id),
        s.status,
        s.final_level or "",
        "" if s.overall_score is None else str(s.overall_score),
        s.avcc_code or "",
        updated,
    ]
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def render_recent_records(recent: RecentRecords) -> str:
    """The HTML page of ``recent`` (every value escaped)."""
    note = (
        f"<p>Scanned the first {recent.scanned} stored records only; older or later ones may be missing.</p>"
        if recent.truncated
        else ""
    )
    rows = "".join(_row(s) for s in recent.records)
    return (
        "<!doctype html><title>AVCC records</title><h1>Recent records</h1>"
        f"{note}<table border=1 cellpadding=4><tr><th>record</th><th>status</th><th>level</th>"
        f"<th>score</th><th>AVCC code</th><th>updated (UTC)</th></tr>{rows}</table>"
    )
