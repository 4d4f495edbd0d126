"""``avcc import``'s resumable import: derived request ids, the state file, resuming after a stop."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.bulk_import import done_lines, import_file, prepare_line, state_path_for
from app.client import ApiError, BatchReport


def test_a_line_without_request_id_gets_one_derived_from_its_bytes() -> None:
    first = prepare_line(1, b'{"title": "a"}\n')
    again = prepare_line(9, b'  {"title": "a"}  ')
    other = prepare_line(2, b'{"title": "b"}')
    ids = [orjson.loads(line.body)["request_id"] for line in (first, again, other)]
    assert ids[0] == ids[1] != ids[2]
    assert ids[0].startswith("imp_") and len(ids[0]) == 36
    assert first.digest == again.digest


def test_lines_with_request_id_or_not_json_are_sent_unchanged() -> None:
    assert (
        prepare_line(1, b'{"request_id": "r1", "title": "a"}\n').body == b'{"request_id": "r1", "title": "a"}'
    )
    assert prepare_line(2, b"{broken\n").body == b"{broken"
    assert prepare_line(3, b"[1, 2]").body == b"[1, 2]"


def test_the_state_file_ignores_a_torn_last_record(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.write_bytes(b'{"line": 1, "digest": "d1", "http_status": 202}\n{"line": 2, "digest": "d2", "htt')
    assert done_lines(state) == {1: "d1"}
    assert done_lines(tmp_path / "missing") == {}


@dataclass
class Server:
    """Answers every line (invalid JSON -> 400, a repeated request_id -> the same record); can
    fail the ``fail_at``-th batch like a connection lost mid-import."""

    fail_at: int | None = None
    batches: list[list[bytes]] = field(default_factory=list)
    records: dict[str, int] = field(default_factory=dict)

    def apply_batch(self, items: list[bytes]) -> BatchReport:
        if self.fail_at is not None and len(self.batches) == self.fail_at:
            raise ApiError(503, {"error": "down"}, "POST", "/v1/avcc/applications:batch")
        self.batches.append(items)
        answers: list[dict[str, Any]] = []
        for index, raw in enumerate(items):
            try:
                request_id = orjson.loads(raw)["request_id"]
            except (orjson.JSONDecodeError, TypeError, KeyError):
                answers.append({"index": index, "http_status": 400, "error": "body: malformed JSON"})
                continue
            record = self.records.setdefault(request_id, 1000 + len(self.records))
            answers.append(
                {"index": index, "http_status": 202, "request_id": request_id, "avcc_record_id": record}
            )
        return BatchReport(answers=answers, requests=1)


def _write(path: Path, count: int) -> None:
    lines = [orjson.dumps({"title": f"work {i}"}) for i in range(count)]
    lines[4] = b"{not json"
    path.write_bytes(b"\n".join(lines[:6]) + b"\n\n" + b"\n".join(lines[6:]) + b"\n")


def test_an_interrupted_import_resumes_without_resending_answered_lines(tmp_path: Path) -> None:
    source = tmp_path / "works.ndjson"
    _write(source, 25)
    server = Server(fail_at=2)
    with pytest.raises(ApiError):
        import_file(server, source, batch_size=10)  # type: ignore[arg-type]
    assert len(done_lines(state_path_for(source))) == 20
    server.fail_at = None
    progress: list[int] = []
    summary = import_file(server, source, batch_size=10, progress=progress.append)  # type: ignore[arg-type]
    assert (summary.lines, summary.skipped, summary.submitted, summary.rejected) == (25, 20, 5, 0)
    assert sum(progress) == 25
    sent = [
        orjson.loads(raw)["request_id"] for batch in server.batches for raw in batch if raw != b"{not json"
    ]
    assert len(sent) == len(set(sent)) == 24
    state = [orjson.loads(raw) for raw in state_path_for(source).read_bytes().splitlines()]
    assert sorted(entry["line"] for entry in state) == [n for n in range(1, 27) if n != 7]
    assert [entry["http_status"] for entry in state if entry["line"] == 5] == [400]


def test_a_rerun_without_state_file_is_idempotent_by_request_id(tmp_path: Path) -> None:
    source = tmp_path / "works.ndjson"
    _write(source, 8)
    server = Server()
    first = import_file(server, source, state_path=tmp_path / "a")  # type: ignore[arg-type]
    again = import_file(server, source, state_path=tmp_path / "b")  # type: ignore[arg-type]
    assert (first.submitted, again.submitted, again.skipped) == (7, 7, 0)
    assert len(server.records) == 7
