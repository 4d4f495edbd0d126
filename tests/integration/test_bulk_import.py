"""Bulk applications end to end: ``avcc import`` through ``POST /v1/avcc/applications:batch`` on the
real core groups (code, review, chain, settlement) and a real broker.

The file mixes valid works with exact duplicate lines (same derived request_id: the same record),
second applications for a work already in the file (409), and invalid lines. The first import is
killed (SIGKILL) once part of the file is answered; the rerun resumes from the state file; a
third run without the state file must change nothing. Every valid work must end with exactly one
record on ``apply.created`` and one issued code. Claims wait only 1 ms per batch, shorter than
any claim can take (a produce acknowledged by the broker and read back), so every batch's first
answer is 429 with Retry-After for its items still in claims, however fast the box: the client
must wait and resend them rather than fail.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, TOPIC_PLAN
from app.servers import KafkaKRaftBroker
from tests.integration.reads import read_range
from tests.integration.stack import API_KEY, API_SECRET, CORE_GROUPS, ROOT, Stack, application, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKS = 2_000
DUPLICATE_LINES = 60
CONFLICTS = 25
INVALID = 30


@pytest.fixture(scope="module")
def stack(module_kafka: KafkaKRaftBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root: Path = tmp_path_factory.mktemp("bulk")
    apply_plan(Settings(kafka_url=f"kafka://{module_kafka.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    env = {"AVCC_BULK_CLAIM_WAIT_S": "0.001", "AVCC_BULK_RETRY_AFTER_S": "1"}
    stack = Stack(module_kafka.bootstrap, root, env=env)
    stack.start(*CORE_GROUPS)
    yield stack
    stack.stop_all()


def _work(i: int) -> dict[str, Any]:
    body = application(title=f"bulk work {i}")
    del body["request_id"]  # derived from the line by avcc import
    body["content_hash"] = "sha256:" + hashlib.sha256(f"bulk-{i}".encode()).hexdigest()
    return body


def _write_file(path: Path) -> set[str]:
    """The import file; the content hashes of its valid works."""
    rng = random.Random(11)
    works = [orjson.dumps(_work(i)) for i in range(WORKS)]
    lines = list(works)
    lines += rng.sample(works, DUPLICATE_LINES)
    for i in range(INVALID):
        lines.append(b"{broken json" if i % 2 else orjson.dumps({**_work(10_000 + i), "title": ""}))
    rng.shuffle(lines)
    # the same works applied for again by someone else, in the last batch: after their first claim
    lines += [
        orjson.dumps({**_work(i), "request_id": f"other_{i}"}) for i in rng.sample(range(WORKS), CONFLICTS)
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return {str(_work(i)["content_hash"]) for i in range(WORKS)}


def _import(stack: Stack, path: Path, state: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "app", "import", str(path), "--state", str(state), "--quiet"]
    env = {
        **os.environ,
        "AVCC_CLIENT_URL": stack.url("code"),
        "AVCC_CLIENT_KEY": API_KEY,
        "AVCC_CLIENT_SECRET": API_SECRET,
    }
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(process: subprocess.Popen[bytes], timeout_s: float = 600) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, err.decode(errors="replace")
    summary: dict[str, Any] = orjson.loads(out)
    return summary


def _state(state: Path) -> list[dict[str, Any]]:
    return [orjson.loads(raw) for raw in state.read_bytes().splitlines() if raw.strip()]


def _hash_of(line: bytes) -> str | None:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return str(value.get("content_hash")) if isinstance(value, dict) else None


def _records_on_apply_created(bootstrap: str) -> dict[str, set[int]]:
    """content_hash -> the record ids ``apply.created`` names for it, the topic read to its end
    offsets (every claim answered 202 was produced and acknowledged before its answer)."""
    seen: dict[str, set[int]] = defaultdict(set)
    for message in read_range(bootstrap, APPLY_CREATED.name, timeout_s=120):
        payload = orjson.loads(message.value())["payload"]
        seen[payload["content_hash"]].add(int(payload["avcc_record_id"]))
    return seen


def test_import_with_duplicates_invalid_lines_and_an_interruption_issues_each_work_once(
    stack: Stack, tmp_path: Path
) -> None:
    source = tmp_path / "works.ndjson"
    valid_hashes = _write_file(source)
    state = tmp_path / "works.state"

    first = _import(stack, source, state)
    try:
        wait_for(lambda: (state.exists() and len(_state(state)) >= 1_000) or first.poll() is not None, 300)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
        first.communicate(timeout=30)
    answered_before = len(_state(state))
    assert answered_before < WORKS + DUPLICATE_LINES + CONFLICTS + INVALID, "the import was not interrupted"

    resumed = _finish(_import(stack, source, state))
    total = WORKS + DUPLICATE_LINES + CONFLICTS + INVALID
    assert resumed["lines"] == total
    assert resumed["skipped"] == answered_before
    assert resumed["throttled"] > 0, "no 429 was waited out"

    entries = _state(state)
    assert sorted(e["line"] for e in entries) == list(range(1, total + 1))
    by_status: dict[int, int] = defaultdict(int)
    for entry in entries:
        by_status[entry["http_status"]] += 1
    assert by_status == {202: WORKS + DUPLICATE_LINES, 409: CONFLICTS, 400: INVALID}

    lines = source.read_bytes().splitlines()
    record_of_hash: dict[str, set[int]] = defaultdict(set)
    for entry in entries:
        if entry["http_status"] != 400:
            content_hash = orjson.loads(lines[entry["line"] - 1])["content_hash"]
            record_of_hash[content_hash].add(entry["avcc_record_id"])
    assert set(record_of_hash) == valid_hashes
    assert all(len(ids) == 1 for ids in record_of_hash.values())

    again = _finish(_import(stack, source, tmp_path / "fresh.state"))  # no state: idempotent by request_id
    assert (again["submitted"], again["conflicts"], again["rejected"]) == (
        WORKS + DUPLICATE_LINES,
        CONFLICTS,
        INVALID,
    )
    again_ids = {
        e["line"]: e.get("avcc_record_id")
        for e in _state(tmp_path / "fresh.state")
        if e["http_status"] != 400
    }
    assert again_ids == {e["line"]: e["avcc_record_id"] for e in entries if e["http_status"] != 400}

    # the works of this file (the module's other test applies works of its own)
    in_file = {_hash_of(line) for line in lines} - {None}
    on_topic = {h: ids for h, ids in _records_on_apply_created(stack.bootstrap).items() if h in in_file}
    assert set(on_topic) == valid_hashes
    assert {h: ids for h, ids in on_topic.items() if ids != record_of_hash[h]} == {}

    # this file's records, by id: the module's other test issues works of its own, in either order
    record_ids = {next(iter(ids)) for ids in record_of_hash.values()}
    pending = set(record_ids)

    def all_issued() -> bool:
        pending.difference_update(asyncio.run(_issued_among(stack, sorted(pending))))
        return not pending

    try:
        wait_for(all_issued, 600, interval=2.0)
    except AssertionError:
        _, body = asyncio.run(stack.call("code", "GET", "/v1/avcc/record-counts"))
        raise AssertionError(
            f"{len(pending)} of {len(record_ids)} works not issued: {sorted(pending)[:20]} {body}\n"
            f"{stack.logs(['code'])}"
        ) from None
    status, body = asyncio.run(stack.call("code", "GET", "/v1/avcc/record-counts"))
    assert status == 200, body
    assert body["counts"].get("issued", 0) >= WORKS


async def _issued_among(stack: Stack, record_ids: list[int]) -> set[int]:
    """The ids among ``record_ids`` whose record the code group answers as issued."""
    issued: set[int] = set()
    for record_id in record_ids:
        status, body = await stack.call("code", "GET", f"/v1/avcc/records/{record_id}")
        if status == 200 and body["status"] == "issued":
            issued.add(record_id)
    return issued


def post_batch(stack: Stack, body: bytes, content_type: str) -> tuple[int, Any]:
    """POST a batch; a 429 (items still in claims: the module's claim wait is 1 ms) is resent
    as it is after Retry-After, which must end in the final answers."""
    for _ in range(30):
        status, answer = asyncio.run(
            stack.call(
                "code",
                "POST",
                "/v1/avcc/applications:batch",
                raw=body,
                headers={"Content-Type": content_type},
            )
        )
        if status != 429:
            return status, answer
        time.sleep(1.0)  # the module's AVCC_BULK_RETRY_AFTER_S
    raise AssertionError(f"still 429 after 30 tries: {answer}")


def test_a_batch_answers_each_item_like_the_single_route(stack: Stack) -> None:
    taken = application()
    status, single = asyncio.run(stack.call("code", "POST", "/v1/avcc/applications", taken))
    assert status == 202, single
    invalid = {**application(), "priority": 42}
    _, single_invalid = asyncio.run(stack.call("code", "POST", "/v1/avcc/applications", invalid))
    conflict = {**taken, "request_id": f"other_{uuid.uuid4().hex[:8]}"}
    _, single_conflict = asyncio.run(stack.call("code", "POST", "/v1/avcc/applications", conflict))
    fresh = application()
    batch = [fresh, taken, conflict, invalid, fresh]

    status, answer = post_batch(stack, orjson.dumps(batch), "application/json")
    assert status == 202, answer
    items = answer["items"]
    assert [i["http_status"] for i in items] == [202, 202, 409, 400, 202]
    assert items[1] == {"index": 1, "http_status": 202, **single}
    assert items[2]["avcc_record_id"] == single_conflict["avcc_record_id"] == single["avcc_record_id"]
    assert items[2]["error"] == single_conflict["error"]
    assert items[3] == {
        "index": 3,
        "http_status": 400,
        "error": single_invalid["error"],
        "reason": single_invalid["reason"],
        "fields": ["priority"],
    }
    assert items[0]["avcc_record_id"] == items[4]["avcc_record_id"] != single["avcc_record_id"]
    assert (answer["submitted"], answer["conflicts"], answer["rejected"], answer["throttled"]) == (3, 1, 1, 0)

    ndjson = b"\n".join(orjson.dumps(item) for item in (fresh, taken))
    status, answer = post_batch(stack, ndjson, "application/x-ndjson")
    assert status == 202, answer
    assert [i["avcc_record_id"] for i in answer["items"]] == [
        items[0]["avcc_record_id"],
        single["avcc_record_id"],
    ]
