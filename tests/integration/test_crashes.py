"""Crashes on the full core pipeline: SIGKILLed workers, a second worker taking over, and a
broker restart. Effects are counted: every application issued once, one chain transaction per
record, one code per record, lag back to zero.

The stack and its broker are this module's own: it kills workers and restarts the broker, and
counts every ledger transaction of the chain worker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.lifecycle.chain.ledger import verify_ledger
from app.ops.lag.settings import LagSettings
from app.platform.faust.app import consumer_group_id
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.kafka.clients import admin_client
from app.platform.lag.reader import OffsetReader
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, TOPIC_PLAN
from app.servers import KafkaKRaftBroker
from tests.integration.stack import CORE_GROUPS, Stack, application, issued_exactly_once

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def crash_broker(module_kafka: KafkaKRaftBroker) -> KafkaKRaftBroker:
    """The module's broker, running (a test restarts it)."""
    module_kafka.start()
    return module_kafka


@pytest.fixture(scope="module")
def crash_stack(crash_broker: KafkaKRaftBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """code, review, chain and settlement workers of this module, restarted when they exit."""
    root = tmp_path_factory.mktemp("crash-stack")
    apply_plan(Settings(kafka_url=f"kafka://{crash_broker.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    # a worker whose consumer stalls (seen after a broker restart) exits and is restarted
    stack = Stack(crash_broker.bootstrap, root, env={"AVCC_WORKER_STALL_S": "45"})
    try:
        stack.start(*CORE_GROUPS)
        stack.supervise()
        yield stack
    finally:
        stack.stop_all()


@pytest.fixture
def core_stack(crash_stack: Stack) -> Stack:
    """The module's stack, every worker ready (the other test restarts the broker and kills workers)."""
    crash_stack.wait_all_ready()
    return crash_stack


async def submit(stack: Stack, body: dict[str, Any], deadline_s: float = 90.0) -> int:
    """POST an application, retrying (same request_id) through outages until it is accepted."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    last: Any = None
    while loop.time() < end:
        try:
            status, answer = await stack.call("code", "POST", "/v1/avcc/applications", body)
        except Exception as exc:  # connection refused/reset while the pipeline recovers
            last = exc
        else:
            if status == 202:
                return int(answer["avcc_record_id"])
            last = (status, answer)
        await asyncio.sleep(0.5)
    raise AssertionError(f"application {body['request_id']} never accepted: {last}")


def committed_lag(bootstrap: str, group: str, topic: str) -> int | None:
    """End offset minus committed offset summed over ``topic``'s partitions, as the lag reader
    sees them; ``None`` when some partition could not be read this time."""
    settings = Settings(kafka_url=f"kafka://{bootstrap}")
    partitions = sorted(admin_client(settings).list_topics(topic, timeout=10).topics[topic].partitions)
    reader = OffsetReader(settings, watched=LagSettings(rules=()).watched())
    try:
        rows = reader.group_offsets(group, [(topic, p) for p in partitions])
    finally:
        reader.close()
    if sorted(row.partition for row in rows) != partitions:
        return None
    return sum(row.lag for row in rows)


async def test_sigkilled_workers_lose_and_duplicate_nothing(core_stack: Stack) -> None:
    """Two review workers share the partitions; one is SIGKILLed mid-stream (the other takes its
    partitions and recovers its table), the chain worker is SIGKILLed too; both restart."""
    ledger = core_stack.data_dir("chain") / "ledger"
    txs_before = verify_ledger(ledger).transactions
    core_stack.start("review", index=1)
    try:
        bodies = [application(request_id=f"req_crash_{uuid.uuid4().hex[:10]}") for _ in range(90)]
        record_ids: list[int] = []
        for n, body in enumerate(bodies):
            if n == 30:
                core_stack.worker("review", 0).kill()
            if n == 50:
                core_stack.worker("chain").kill()
                core_stack.worker("chain").start(wait=False)
            if n == 70:
                core_stack.worker("review", 0).start(wait=False)
            record_ids.append(await submit(core_stack, body))
        core_stack.worker("review", 0).wait_ready()
        core_stack.worker("chain").wait_ready()

        await issued_exactly_once(core_stack, record_ids)
        check = verify_ledger(ledger)
        assert check.ok, check.error
        lost_or_doubled = "a crash lost or duplicated a chain transaction"
        assert check.transactions - txs_before == len(bodies), lost_or_doubled
        group = consumer_group_id("review")
        for _ in range(60):
            if await asyncio.to_thread(committed_lag, core_stack.bootstrap, group, APPLY_CREATED.name) == 0:
                break
            await asyncio.sleep(1)
        assert await asyncio.to_thread(committed_lag, core_stack.bootstrap, group, APPLY_CREATED.name) == 0
    finally:
        # A failure must not leave a second review worker for the other test.
        core_stack.stop("review", 1)


async def test_broker_restart_during_production_loses_nothing(
    core_stack: Stack, crash_broker: KafkaKRaftBroker
) -> None:
    ledger = core_stack.data_dir("chain") / "ledger"
    txs_before = verify_ledger(ledger).transactions
    bodies = [application(request_id=f"req_brk_{uuid.uuid4().hex[:10]}") for _ in range(40)]
    record_ids: list[int] = []
    for n, body in enumerate(bodies):
        if n == 15:
            crash_broker.restart()  # from this thread: the broker dies with the thread that starts it
        record_ids.append(await submit(core_stack, body, deadline_s=180))
    assert len(set(record_ids)) == len(bodies)
    await issued_exactly_once(core_stack, record_ids)
    check = verify_ledger(ledger)
    assert check.ok, check.error
    assert check.transactions - txs_before == len(bodies)
