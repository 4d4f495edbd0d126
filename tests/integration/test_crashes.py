"""Crashes on the full core pipeline: SIGKILLed workers, a second worker taking over, and a
broker restart. Effects are counted: every application issued once, one chain transaction per
record, one code per record, lag back to zero."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from app.lifecycle.chain.ledger import verify_ledger
from app.ops.lag.reader import OffsetReader
from app.ops.lag.settings import LagSettings
from app.platform.faust.app import consumer_group_id
from app.platform.kafka.clients import admin_client
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED
from tests.integration.stack import Stack, application, issued_exactly_once


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
    reader = OffsetReader(settings, LagSettings(rules=()))
    try:
        rows = reader.group_offsets(group, [(topic, p) for p in partitions])
    finally:
        reader.close()
    if sorted(row.partition for row in rows) != partitions:
        return None
    return sum(row.lag for row in rows)


async def test_sigkilled_workers_lose_and_duplicate_nothing(core_stack: Stack, stack_broker: Any) -> None:
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
        # A failure must not leave a second review worker in the session stack for later tests.
        core_stack.stop("review", 1)


async def test_broker_restart_during_production_loses_nothing(core_stack: Stack, stack_broker: Any) -> None:
    ledger = core_stack.data_dir("chain") / "ledger"
    txs_before = verify_ledger(ledger).transactions
    bodies = [application(request_id=f"req_brk_{uuid.uuid4().hex[:10]}") for _ in range(40)]
    record_ids: list[int] = []
    for n, body in enumerate(bodies):
        if n == 15:
            stack_broker.restart()  # from this thread: the broker dies with the thread that starts it
        record_ids.append(await submit(core_stack, body, deadline_s=180))
    assert len(set(record_ids)) == len(bodies)
    await issued_exactly_once(core_stack, record_ids)
    check = verify_ledger(ledger)
    assert check.ok, check.error
    assert check.transactions - txs_before == len(bodies)
