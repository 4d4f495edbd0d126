"""Regression tests for the faust consumer fixes in app/transport.py (messages lost around
back-to-back rebalances: 18 of 90 applications were never reviewed)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from faust.types import TP

from app.platform.faust import transport
from app.platform.faust.app import get_app
from app.platform.faust.transport import _Consumer

TOPIC = "topic.avcc.apply.created"
tp = TP(TOPIC, 0)


@dataclass(eq=False)
class FakeMessage:
    """The fields faust's Consumer.ack reads."""

    offset: int
    generation_id: int
    topic: str = TOPIC
    tp: TP = tp
    acked: bool = False
    refcount: int = 0


@pytest.fixture
def consumer() -> Any:
    app = get_app("review")
    app.topics.acking_topics.add(TOPIC)
    c = app.consumer
    assert isinstance(c, _Consumer)
    c._acked.clear()
    c._acked_index.clear()
    c._committed_offset.clear()
    c._gap.clear()
    app.consumer_generation_id = 7
    return c


def test_acks_of_a_previous_generation_never_become_committable(consumer: Any) -> None:
    consumer._committed_offset[tp] = 10
    stale = FakeMessage(offset=10, generation_id=6)
    assert consumer.ack(stale) is False
    assert stale.acked and stale not in consumer._unacked_messages
    assert consumer._new_offset(tp) is None
    current = FakeMessage(offset=10, generation_id=7)
    assert consumer.ack(current) is True
    assert consumer._new_offset(tp) == 11


def test_no_commit_while_the_head_offset_is_unacked(consumer: Any) -> None:
    """faust tolerated one unacked message at the head (min(acked) - committed > 1)."""
    consumer._committed_offset[tp] = 31
    for offset in (32, 33):
        assert consumer.ack(FakeMessage(offset=offset, generation_id=7))
    assert consumer._new_offset(tp) is None
    assert consumer.ack(FakeMessage(offset=31, generation_id=7))
    assert consumer._new_offset(tp) == 34


def test_commits_the_contiguous_run_and_keeps_the_rest(consumer: Any) -> None:
    consumer._committed_offset[tp] = 0
    for offset in (0, 1, 2, 5, 6):
        consumer.ack(FakeMessage(offset=offset, generation_id=7))
    assert consumer._new_offset(tp) == 3
    assert consumer._acked[tp] == [5, 6]


def test_gaps_the_broker_never_delivered_count_as_acked(consumer: Any) -> None:
    consumer._committed_offset[tp] = 0
    consumer._gap[tp].addi(1, 3)  # offsets 1 and 2 are compacted away / control records
    for offset in (0, 3):
        consumer.ack(FakeMessage(offset=offset, generation_id=7))
    assert consumer._new_offset(tp) == 4


async def test_read_offsets_of_earlier_generations_are_forgotten_at_seek(consumer: Any) -> None:
    """A partition without a committed offset kept the last offset an earlier generation read,
    so its unprocessed messages were dropped as "already read" when it came back."""

    async def no_committed_offsets() -> dict[Any, int]:
        return {}

    consumer._read_offset[tp] = 13
    consumer.seek_to_committed = no_committed_offsets
    await consumer.perform_seek()
    assert consumer._read_offset[tp] is None


async def test_a_head_left_unacked_while_later_offsets_are_acked_is_fetched_again(
    consumer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen after a broker failover: committed=11 read=38 acked=[12..38], the head never came."""
    seeks: list[tuple[TP, int]] = []

    async def seek(partition: TP, offset: int) -> None:
        seeks.append((partition, offset))

    clock = [1000.0]
    monkeypatch.setattr(transport, "_now", lambda: clock[0])
    monkeypatch.setattr(consumer, "seek", seek)
    monkeypatch.setattr(consumer, "assignment", lambda: {tp})
    consumer._head_missing_since.clear()
    consumer._committed_offset[tp] = 11
    for offset in range(12, 39):
        consumer.ack(FakeMessage(offset=offset, generation_id=7))
    assert consumer._new_offset(tp) is None
    clock[0] += transport.HEAD_RESEEK_S - 1
    assert consumer._new_offset(tp) is None
    await asyncio.sleep(0)
    assert seeks == []  # not yet: the head may still be on its way
    clock[0] += 1
    assert consumer._new_offset(tp) is None
    await asyncio.sleep(0)
    assert seeks == [(tp, 11)]
    assert consumer._new_offset(tp) is None  # one seek per period
    await asyncio.sleep(0)
    assert seeks == [(tp, 11)]
    consumer.ack(FakeMessage(offset=11, generation_id=7))  # fetched again and processed
    assert consumer._new_offset(tp) == 39
    assert tp not in consumer._head_missing_since
