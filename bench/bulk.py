"""The ``bulk_import`` figure: N works through ``POST /v1/avcc/applications:batch`` as ``avcc import``
sends them (batches of 1,000, 429s waited out), then until every one is issued."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson

from app.bulk_import import import_file
from app.client import AvccClient
from bench.data import o_level_application

__all__ = ["ISSUED_POLL_S", "bulk_import_figure"]

#: How often the issued count is read: each reading scans every record the code worker holds
#: (100,000 records: about half a second of its CPU), so reading it every second would slow
#: what it measures.
ISSUED_POLL_S = 3.0


def _issued(client: AvccClient) -> int:
    return client.record_counts().get("issued", 0)


def bulk_import_figure(base: str, applications: int, work: Path, key: str, secret: str) -> dict[str, Any]:
    """Import ``applications`` fresh O-level works; accepted per second (the import) and issued
    per second (from the first request until the last code is issued); ``issued`` counts the
    records issued during the import, read once more after the last: exactly ``applications``
    when each work was issued once."""
    source = work / "bulk.ndjson"
    with source.open("wb") as out:
        for _ in range(applications):
            out.write(orjson.dumps(o_level_application()) + b"\n")
    client = AvccClient(base, key, secret, max_retries=600, timeout_s=120.0)
    before = _issued(client)
    started = time.monotonic()
    summary = import_file(client, source, state_path=work / "bulk.import-state")
    deadline = time.monotonic() + max(120.0, applications / 20)
    issued_s: float | None = None
    issued = 0
    while time.monotonic() < deadline:
        issued = _issued(client) - before
        if issued >= applications:
            issued_s = time.monotonic() - started
            break
        time.sleep(ISSUED_POLL_S)
    time.sleep(ISSUED_POLL_S)
    issued = _issued(client) - before  # a second code for one work would show here as an extra
    if issued_s is None:
        print(
            f"WARNING: not every bulk application issued within {deadline - started:.0f} s", file=sys.stderr
        )
    return {
        "name": "bulk_import",
        "applications": applications,
        "per_s": round(summary.per_s, 1),
        "issued_per_s": round(applications / issued_s, 1) if issued_s else None,
        "submitted": summary.submitted,
        "issued": issued,
        "requests": summary.requests,
        "throttled": summary.throttled,
    }
