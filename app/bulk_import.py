"""Bulk import of an NDJSON file of applications, resumable: what ``avcc import`` runs.

Each non-empty line is one application. A line without ``request_id`` gets one derived from its
bytes (``imp_`` + the first 32 hex digits of their SHA-256), so importing the same file again
sends the same request ids and the server answers each with the record it already has: a rerun
is idempotent even without the state file. Lines are sent in batches
(:meth:`~app.client.AvccClient.apply_batch`, which waits out 429s); after each batch the final
answer of every line is appended to the state file (``FILE.import-state`` by default) as
``{"line", "digest", "http_status", ...}``. A rerun skips every line whose number and digest are
in the state file, so an import interrupted at any point resumes where it stopped, and a line
edited since is sent again.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from app.client import AvccClient

__all__ = [
    "ImportSummary",
    "Line",
    "done_lines",
    "import_file",
    "prepare_line",
    "read_lines",
    "state_path_for",
]

#: Prefix of request ids derived from a line's bytes.
REQUEST_ID_PREFIX: Final = "imp_"


@dataclass(frozen=True, slots=True)
class Line:
    """One application line: its 1-based number, digest, and the bytes sent for it."""

    number: int
    digest: str
    body: bytes


@dataclass(slots=True)
class ImportSummary:
    """What an import did (``skipped``: lines answered by an earlier run)."""

    lines: int = 0
    skipped: int = 0
    submitted: int = 0
    conflicts: int = 0
    rejected: int = 0
    requests: int = 0
    throttled: int = 0
    waited_s: float = 0.0
    seconds: float = 0.0

    @property
    def per_s(self) -> float:
        """Lines answered per second by this run."""
        done = self.submitted + self.conflicts + self.rejected
        return done / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The summary as the CLI prints it."""
        return {
            **asdict(self),
            "waited_s": round(self.waited_s, 3),
            "seconds": round(self.seconds, 3),
            "per_s": round(self.per_s, 1),
        }


def state_path_for(path: Path) -> Path:
    """The default state file of an import of ``path``."""
    return path.with_name(path.name + ".import-state")


def prepare_line(number: int, raw: bytes) -> Line:
    """The line as it is sent: with a derived ``request_id`` when it is an object without one;
    anything else unchanged (the server answers it with the field it lacks)."""
    stripped = raw.strip()
    digest = hashlib.sha256(stripped).hexdigest()
    try:
        item = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return Line(number, digest[:32], stripped)
    if isinstance(item, dict) and "request_id" not in item:
        item["request_id"] = REQUEST_ID_PREFIX + digest[:32]
        return Line(number, digest[:32], orjson.dumps(item))
    return Line(number, digest[:32], stripped)


def read_lines(path: Path) -> Iterator[Line]:
    """Every non-empty line of ``path``, prepared (1-based line numbers of the file)."""
    with path.open("rb") as source:
        for number, raw in enumerate(source, start=1):
            if raw.strip():
                yield prepare_line(number, raw)


def done_lines(state_path: Path) -> dict[int, str]:
    """Line number -> digest of every line a previous run has a final answer for (a torn last
    record of an interrupted write is ignored)."""
    done: dict[int, str] = {}
    if not state_path.exists():
        return done
    with state_path.open("rb") as state:
        for raw in state:
            try:
                entry = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("line"), int):
                done[entry["line"]] = str(entry.get("digest"))
    return done


def _batches(lines: Iterator[Line], size: int) -> Iterator[list[Line]]:
    batch: list[Line] = []
    for line in lines:
        batch.append(line)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def import_file(
    client: AvccClient,
    path: Path,
    *,
    state_path: Path | None = None,
    batch_size: int = 1_000,
    progress: Callable[[int], None] | None = None,
) -> ImportSummary:
    """Import ``path`` (see the module doc); ``progress(n)`` after every ``n`` lines handled."""
    if not 1 <= batch_size <= 1_000:
        raise ValueError("batch_size must be 1..1000")
    state_path = state_path or state_path_for(path)
    done = done_lines(state_path)
    summary = ImportSummary()
    started = time.monotonic()
    todo: list[Line] = []
    for line in read_lines(path):
        summary.lines += 1
        if done.get(line.number) == line.digest:
            summary.skipped += 1
        else:
            todo.append(line)
    if progress is not None and summary.skipped:
        progress(summary.skipped)
    with state_path.open("ab") as state:
        for batch in _batches(iter(todo), batch_size):
            report = client.apply_batch([line.body for line in batch])
            summary.requests += report.requests
            summary.throttled += report.throttled
            summary.waited_s += report.waited_s
            records = []
            for line, answer in zip(batch, report.answers, strict=True):
                status = int(answer["http_status"])
                summary.submitted += status == 202
                summary.conflicts += status == 409
                summary.rejected += status == 400
                kept = {k: answer[k] for k in ("avcc_record_id", "request_id", "error") if k in answer}
                records.append(
                    orjson.dumps({"line": line.number, "digest": line.digest, "http_status": status, **kept})
                    + b"\n"
                )
            state.write(b"".join(records))
            state.flush()
            os.fsync(state.fileno())
            if progress is not None:
                progress(len(batch))
    summary.seconds = time.monotonic() - started
    return summary
