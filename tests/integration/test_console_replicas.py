"""Records by status with two code replicas on distinct loopback addresses (one port each, like
pods), the review group and the ops console on a real Apache Kafka broker (issue 26).

Twelve applications wait for a human. The overview's records by status add up to twelve with
both replicas answering, and every replica's ``/v1/avcc/record-counts`` answers the same. Then one
replica (not the one the console is pointed at) is SIGKILLed: until the group notices, the page
names it with the partitions it held, counts the rest exactly and still renders everything else;
once the survivor holds every partition, the counts are whole again.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.kafka.partitioner import partition_for, record_key
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, TOPIC_PLAN
from app.servers import KafkaKRaftBroker
from tests.integration.stack import API_KEY, Stack, application, record_when

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

OPERATOR, PASSWORD = "operator", "operator-pass"
APPLICATIONS = 12
UNKNOWN_MODEL = {"model_name": "home-made-diffuser", "model_version": "v2.1.0"}
#: Long enough that the killed replica stays in the group's assignment while the page is read.
SESSION_TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def replica_stack(
    module_kafka: KafkaKRaftBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Two code replicas, one review worker and the ops console (pointed at code replica 0)."""
    apply_plan(Settings(kafka_url=f"kafka://{module_kafka.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    stack = Stack(
        module_kafka.bootstrap,
        tmp_path_factory.mktemp("console-replicas"),
        env={
            "AVCC_CONSOLE_KEY_ID": API_KEY,
            "AVCC_LAG_INTERVAL_S": "1",
            "AVCC_KAFKA_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
        },
    )
    try:
        stack.start("code", replicas=2)
        stack.start("review")
        stack.env.update(
            AVCC_CONSOLE_CODE_URL=stack.url("code", 0), AVCC_CONSOLE_REVIEW_URL=stack.url("review")
        )
        stack.start("ops")
        yield stack
    finally:
        stack.stop_all()


async def _console_home(stack: Stack) -> str:
    login = {"Authorization": aiohttp.encode_basic_auth(OPERATOR, PASSWORD)}
    async with (
        aiohttp.ClientSession(headers=login) as session,
        session.get(stack.url("ops") + "/") as response,
    ):
        assert response.status == 200, await response.text()
        return await response.text()


def _records(page: str) -> dict[str, int]:
    """Records by status as the overview shows them."""
    table = re.search(r"<table id='records'>(.*?)</table>", page, re.S)
    assert table is not None, page
    rows = re.findall(r'<tr data-status="([a-z_]+)">.*?<td class=\'n\'>(\d+)</td></tr>', table.group(1))
    return {status: int(n) for status, n in rows}


def _silent_replicas(page: str) -> dict[str, str]:
    """Replica URL -> the partitions the page says it held, for each replica named as silent."""
    return dict(
        re.findall(
            r"class='flash error replica-missing' data-replica='([^']+)' data-partitions='([^']*)'", page
        )
    )


async def _until(what: str, check: Any, timeout_s: float, stack: Stack) -> Any:
    """Poll the async ``check`` until it returns something truthy (the box is shared: generous)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} not seen within {timeout_s}s\n{stack.logs(['code', 'ops'])}")


async def test_records_by_status_add_up_over_replicas_and_name_a_silent_one(replica_stack: Stack) -> None:
    stack = replica_stack
    record_ids = []
    for _ in range(APPLICATIONS):
        status, answer = await stack.call_settled(
            "code", "POST", "/v1/avcc/applications", application(ai_tool_info=UNKNOWN_MODEL)
        )
        assert status == 202, answer
        record_ids.append(int(answer["avcc_record_id"]))
    for record_id in record_ids:
        await record_when(stack, record_id, lambda r: r["status"] == "need_human", wait_s=120)

    async def both_counted() -> dict[str, Any] | None:
        status, body = await stack.call("code", "GET", "/v1/avcc/record-counts")
        answered = [r for r in body.get("replicas", ()) if r["answered"]] if status == 200 else []
        whole = status == 200 and len(answered) == 2 and body["missing_partitions"] == []
        return body if whole and body["counts"] == {"need_human": APPLICATIONS} else None

    counts = await _until("both replicas counting every record", both_counted, 180, stack)
    held = {r["url"]: r["partitions"] for r in counts["replicas"]}
    assert sorted(p for partitions in held.values() for p in partitions) == list(
        range(APPLY_CREATED.partitions)
    )
    assert set(held) == {stack.url("code", 0), stack.url("code", 1)}
    # Every replica answers the same (each merges the other's counts).
    status, other = await stack.call("code", "GET", "/v1/avcc/record-counts", index=1)
    assert status == 200 and other["counts"] == counts["counts"], other

    async def page_adds_up() -> str | None:
        page = await _console_home(stack)
        return page if sum(_records(page).values()) == APPLICATIONS else None

    page = await _until("the overview adding up to every record", page_adds_up, 60, stack)
    assert _records(page)["need_human"] == APPLICATIONS and _silent_replicas(page) == {}
    assert stack.url("code", 1) in page and "id='records-sources'" in page

    # Replica 1 dies without leaving the group: until the session times out, the assignment
    # still names it and the page says which partitions are not counted.
    gone = stack.url("code", 1)
    gone_partitions = held[gone]
    stack.worker("code", 1).kill()
    counted_elsewhere = sum(
        partition_for(record_key(r), APPLY_CREATED.partitions) not in gone_partitions for r in record_ids
    )

    async def page_names_the_silent_replica() -> str | None:
        page = await _console_home(stack)
        return page if gone in _silent_replicas(page) else None

    page = await _until("the page naming the killed replica", page_names_the_silent_replica, 60, stack)
    assert _silent_replicas(page)[gone] == ", ".join(str(p) for p in gone_partitions)
    assert f"the records of its partitions {', '.join(map(str, gone_partitions))} are not counted" in page
    assert _records(page).get("need_human") == counted_elsewhere
    for part in ("<table id='topics'>", "<table id='dlq'>", "<ul id='anomalies'>", "Records by status"):
        assert part in page, part  # the rest of the overview still renders

    # The group notices, the survivor takes every partition over: whole again.
    async def whole_again() -> str | None:
        page = await _console_home(stack)
        whole = _records(page).get("need_human") == APPLICATIONS and not _silent_replicas(page)
        return page if whole else None

    await _until("the counts whole again on the surviving replica", whole_again, 240, stack)
    print(json.dumps({"held": held, "killed": gone, "counted_while_silent": counted_elsewhere}))
