"""Backups end to end on a real broker: the state topics exported with ``avcc backup export``,
the broker's data deleted, restored with ``avcc backup import`` into the now empty broker, and a
code worker started on an empty data dir serves every record with the same AVCC code.

The state is a registry in small: works that went through the whole pipeline (apply, review,
chain, code issued), a dead letter, and 20,000 works copied from the issued ones into the code
group's changelogs (:mod:`bench.code_state`). After the restore, a new application gets a record
id that no restored record has (the claims topic's offsets were put back), and a work applied for
again is answered with its restored record.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import zlib
from pathlib import Path
from typing import Any, Protocol

import pytest

from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, CODE_CLAIMS, DLQ, TOPIC_PLAN
from bench.code_state import (
    CLAIMS_CHANGELOG,
    RECORDS_CHANGELOG,
    FilledWork,
    fill_changelogs,
    issued_templates,
    read_changelog,
    synthetic_works,
)
from tests.figures import Report
from tests.integration.reads import end_offsets
from tests.integration.stack import CORE_GROUPS, Stack, application, issued_exactly_once, run_avcc, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REAL_WORKS = 12
COPIED_WORKS = 20_000


class Broker(Protocol):
    """What the test needs of the module's broker: its address, its data, a stop and a start."""

    @property
    def bootstrap(self) -> str: ...

    @property
    def log_dir(self) -> Path: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


def produce_garbage(bootstrap: str) -> None:
    """One undecodable message on ``apply.created``: its consumers dead-letter it."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(APPLY_CREATED.name, b"not json", b"1")
    assert producer.flush(30) == 0


def state(bootstrap: str) -> dict[str, dict[bytes, int]]:
    """key -> crc32 of the latest value of each key of the code group's two changelogs."""
    return {
        topic: read_changelog(bootstrap, topic, value_of=zlib.crc32)
        for topic in (RECORDS_CHANGELOG, CLAIMS_CHANGELOG)
    }


async def apply_through_the_pipeline(stack: Stack, count: int) -> list[dict[str, Any]]:
    """``count`` works applied for and issued; their records and applications."""
    bodies = [application() for _ in range(count)]
    ids = []
    for body in bodies:
        status, answer = await stack.call_settled("code", "POST", "/v1/avcc/applications", body)
        assert status == 202, answer
        ids.append(answer["avcc_record_id"])
    records = await issued_exactly_once(stack, ids)
    return [{**record, "application": body} for record, body in zip(records, bodies, strict=True)]


def test_a_backup_restored_into_an_empty_broker_serves_the_same_codes(
    module_kafka: Broker, tmp_path: Path, report: Report
) -> None:
    module_kafka.start()
    bootstrap = module_kafka.bootstrap
    env = {"AVCC_KAFKA_URL": f"kafka://{bootstrap}"}
    settings = Settings(kafka_url=env["AVCC_KAFKA_URL"])
    apply_plan(settings, [*TOPIC_PLAN, *changelog_specs()])

    before = Stack(bootstrap, tmp_path / "before")
    try:
        before.start(*CORE_GROUPS)
        real = asyncio.run(apply_through_the_pipeline(before, REAL_WORKS))
        produce_garbage(bootstrap)
        # the code and the review group each dead-letter it
        dead = wait_for(
            lambda: (ends := end_offsets(bootstrap, DLQ.name)) and sum(ends.values()) >= 2 and ends, 60
        )
    finally:
        before.stop_all()
    templates = issued_templates(read_changelog(bootstrap, RECORDS_CHANGELOG))
    works = list(synthetic_works(templates, COPIED_WORKS, settings.avcc_org, settings.avcc_node))
    produced, _ = fill_changelogs(bootstrap, iter(works))
    assert produced == COPIED_WORKS
    saved = state(bootstrap)
    claims_ends = end_offsets(bootstrap, CODE_CLAIMS.name)
    assert len(saved[RECORDS_CHANGELOG]) == REAL_WORKS + COPIED_WORKS

    started = time.monotonic()
    exported = run_avcc(["backup", "export", str(tmp_path / "backup")], env, timeout=300)
    export_s = time.monotonic() - started
    assert exported.returncode == 0, exported.stderr

    module_kafka.stop()
    shutil.rmtree(module_kafka.log_dir)
    module_kafka.start()
    assert not _topics(bootstrap), "the broker's data was deleted: no topic is left"

    started = time.monotonic()
    imported = run_avcc(["backup", "import", str(tmp_path / "backup")], env, timeout=300)
    import_s = time.monotonic() - started
    assert imported.returncode == 0, imported.stderr + imported.stdout
    assert state(bootstrap) == saved
    assert end_offsets(bootstrap, DLQ.name) == dead
    assert end_offsets(bootstrap, CODE_CLAIMS.name) == claims_ends

    after = Stack(bootstrap, tmp_path / "after")
    try:
        after.start("code")
        asyncio.run(check_restored(after, real, works[:: COPIED_WORKS // 200], saved))
    finally:
        after.stop_all()
    report(
        f"restored into an empty broker: {len(saved[RECORDS_CHANGELOG])} records and "
        f"{len(saved[CLAIMS_CHANGELOG])} claims ({REAL_WORKS} through the pipeline), "
        f"{sum(dead.values())} dead letters, claims offsets {sum(claims_ends.values())}; "
        f"export {export_s:.1f} s, import {import_s:.1f} s"
    )


def _topics(bootstrap: str) -> set[str]:
    """The topics on the broker (Kafka's own left out)."""
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    return {name for name in topics if not name.startswith("__")}


async def check_restored(
    stack: Stack, real: list[dict[str, Any]], copied: list[FilledWork], saved: dict[str, dict[bytes, int]]
) -> None:
    """Every real record and a sample of the copied ones served with their codes; a work applied
    for again answered with its record; new works given ids no restored record has."""
    for record in real:
        status, served = await stack.call_settled(
            "code", "GET", f"/v1/avcc/records/{record['avcc_record_id']}"
        )
        assert status == 200, served
        assert served["avcc_code"] == record["avcc_code"] and served["status"] == "issued"
    for work in copied:
        status, served = await stack.call_settled("code", "GET", f"/v1/avcc/records/{work.record_id}")
        assert status == 200 and served["avcc_code"] == work.avcc_code, served
    again = dict(real[0]["application"])
    status, answer = await stack.call_settled("code", "POST", "/v1/avcc/applications", again)
    assert status == 202 and answer["avcc_record_id"] == real[0]["avcc_record_id"], answer
    known = {int(key) for key in saved[RECORDS_CHANGELOG]}
    for _ in range(REAL_WORKS):  # on every claims partition, most likely
        status, answer = await stack.call_settled("code", "POST", "/v1/avcc/applications", application())
        assert status == 202, answer
        assert answer["avcc_record_id"] not in known, f"a restored record's id given again: {answer}"
