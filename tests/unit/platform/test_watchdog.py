"""The stall watchdog: lag that sits still for ``stall_s`` means a stuck consumer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from faust.types import TP

from app.platform.lag.export import recovery_remaining
from app.platform.lag.snapshot import PartitionOffsets
from app.platform.lag.watchdog import RecoveryWatch, StallWatchdog, task_stacks


def row(partition: int, end: int, committed: int | None) -> PartitionOffsets:
    return PartitionOffsets("avcc-chain", "topic.chain.tx.pending", partition, end, committed)


def test_lag_with_a_frozen_committed_offset_stalls_after_the_threshold() -> None:
    dog = StallWatchdog(stall_s=45)
    assert dog.observe([row(0, 10, 4)], now=0) == []
    assert dog.observe([row(0, 12, 4)], now=44) == []
    assert dog.observe([row(0, 12, 4)], now=45) == [("topic.chain.tx.pending", 0)]


def test_progress_or_no_lag_resets_the_clock() -> None:
    dog = StallWatchdog(stall_s=45)
    dog.observe([row(0, 10, 4)], now=0)
    assert dog.observe([row(0, 10, 5)], now=40) == []  # committed moved
    assert dog.observe([row(0, 10, 5)], now=80) == []  # 40 s since the move
    assert dog.observe([row(0, 10, 10)], now=200) == []  # caught up: no lag
    assert dog.observe([row(0, 10, 10)], now=400) == []


def test_revoked_partitions_are_forgotten() -> None:
    dog = StallWatchdog(stall_s=45)
    dog.observe([row(0, 10, 4), row(1, 10, 4)], now=0)
    dog.observe([row(1, 10, 4)], now=10)
    assert dog.observe([row(0, 10, 4), row(1, 10, 4)], now=50) == [("topic.chain.tx.pending", 1)]


def test_the_reply_topic_is_not_a_source_partition() -> None:
    """Regression: the ack-free reply topic is never committed, so its lag never moves; the
    watchdog took that for a stall and restarted the code worker every 45 s."""
    from faust.types import TP

    from agents.code import app  # with its agents and tables: an App without any has no consumer
    from app.platform.lag.export import WorkerLagExporter

    exporter = WorkerLagExporter(app, "code")
    reply = str(app.conf.reply_to)

    class FakeConsumer:
        def assignment(self) -> set[TP]:
            return {TP(reply, 0), TP("topic.avcc.apply.created", 1)}

    app._consumer = FakeConsumer()
    try:
        assert exporter.assigned() == [("topic.avcc.apply.created", 1)]
    finally:
        del app._consumer


async def test_task_stacks_name_where_each_task_waits() -> None:
    async def stuck_on_a_delivery() -> None:
        await asyncio.sleep(60)

    task = asyncio.create_task(stuck_on_a_delivery())
    await asyncio.sleep(0)
    try:
        assert "stuck_on_a_delivery" in task_stacks()
    finally:
        task.cancel()


def test_no_stacks_outside_an_event_loop() -> None:
    assert task_stacks() == ""


def test_a_recovery_that_reads_nothing_stalls_after_the_threshold() -> None:
    """Seen: "No event received for active tp" for minutes; the worker never became ready."""
    watch = RecoveryWatch(stall_s=120)
    assert not watch.observe(24, now=0)
    assert not watch.observe(24, now=119)
    assert watch.observe(24, now=120)


def test_a_recovery_that_reads_or_ends_resets_the_clock() -> None:
    watch = RecoveryWatch(stall_s=120)
    assert not watch.observe(24, now=0)
    assert not watch.observe(20, now=100)  # read 4 offsets
    assert not watch.observe(20, now=219)
    assert not watch.observe(None, now=230)  # recovery done
    assert not watch.observe(20, now=231)
    assert not watch.observe(20, now=350)
    assert not watch.observe(0, now=360)  # caught up, waiting for nothing
    assert not watch.observe(20, now=500)


def test_recovery_remaining_reads_faust_recovery_or_none() -> None:
    recovering = SimpleNamespace(in_recovery=True, active_remaining_total=lambda: 7)
    assert recovery_remaining(SimpleNamespace(tables=SimpleNamespace(recovery=recovering))) == 7
    idle = SimpleNamespace(in_recovery=False, active_remaining_total=lambda: 7)
    assert recovery_remaining(SimpleNamespace(tables=SimpleNamespace(recovery=idle))) is None
    assert recovery_remaining(SimpleNamespace()) is None
