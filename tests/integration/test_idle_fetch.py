"""An idle consumer backs off its fetches on Tansu, and the first message after idling arrives.

Tansu answers a fetch only when its wait expires, and every fetch costs it CPU: four idle core
workers fetching every 50 ms kept it at ~93 % of a core. These tests run the backoff the workers
install (:class:`IdleFetchBackoff`) on a real aiokafka consumer against the real broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from app.platform.faust.idle_fetch import IDLE_AFTER_S, IdleFetchBackoff
from app.servers import TansuBroker

BUSY_MS, IDLE_MS = 50, 400


@dataclass
class Fetching:
    """A started consumer of a fresh topic with the backoff installed, and a producer to it."""

    topic: str
    consumer: AIOKafkaConsumer
    producer: AIOKafkaProducer
    #: The wait of every fetch the consumer made, in order.
    waits: list[int]


@asynccontextmanager
async def fetching(bootstrap: str, topic: str, partitions: int) -> AsyncIterator[Fetching]:
    """:class:`Fetching` on ``topic`` (created with ``partitions``), positioned at its end."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, fetch_max_wait_ms=BUSY_MS, enable_auto_commit=False
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        fetcher: Any = consumer._fetcher
        IdleFetchBackoff(BUSY_MS, IDLE_MS).install(fetcher)
        waits: list[int] = []
        fetch = fetcher._proc_fetch_request

        async def counted(assignment: Any, node_id: Any, request: Any) -> bool:
            waits.append(request._max_wait_ms)
            return bool(await fetch(assignment, node_id, request))

        fetcher._proc_fetch_request = counted
        await consumer.seek_to_end()
        yield Fetching(topic, consumer, producer, waits)
    finally:
        await producer.stop()
        await consumer.stop()


async def test_an_idle_consumer_fetches_less_often_and_still_gets_the_next_message(
    tansu_broker: TansuBroker, unique: str
) -> None:
    async with fetching(tansu_broker.bootstrap, f"idle-fetch-{unique}", 6) as f:
        assert not await f.consumer.getmany(timeout_ms=4000)
        # 4 s at 50 ms would be ~80 fetches; 1 s of them, then 100 -> 200 -> 400 ms: ~30
        busy_first = int(IDLE_AFTER_S * 1000 / BUSY_MS) - 2
        assert len(f.waits) <= 45, f.waits
        assert f.waits[-1] == IDLE_MS and f.waits[:busy_first] == [BUSY_MS] * busy_first, f.waits

        idle_fetches = len(f.waits)
        sent = time.monotonic()
        await f.producer.send_and_wait(f.topic, b"after idling", key=b"k")
        got: list[Any] = []
        while not got and time.monotonic() - sent < 5:
            for records in (await f.consumer.getmany(timeout_ms=500)).values():
                got.extend(records)
        assert [r.value for r in got] == [b"after idling"]
        # at most one idle wait late (plus the fetch that finds it); the next fetch is busy again
        assert time.monotonic() - sent < IDLE_MS / 1000 + 1.0
        await asyncio.sleep(0.2)
        assert BUSY_MS in f.waits[idle_fetches:], f.waits[idle_fetches - 2 :]


async def test_a_busy_consumer_keeps_the_short_wait(tansu_broker: TansuBroker, unique: str) -> None:
    async with fetching(tansu_broker.bootstrap, f"busy-fetch-{unique}", 1) as f:
        received = 0
        for i in range(30):  # a message every 20 ms: most fetches find one
            await f.producer.send_and_wait(f.topic, str(i).encode(), key=b"k")
            for records in (await f.consumer.getmany(timeout_ms=20)).values():
                received += len(records)
        while received < 30:
            batches = await f.consumer.getmany(timeout_ms=1000)
            assert batches, f"only {received} of 30 received"
            received += sum(map(len, batches.values()))
        later = f.waits[2:]
        assert len([w for w in later if w == BUSY_MS]) >= len(later) // 2, f.waits
        assert max(later) < IDLE_MS, f.waits
