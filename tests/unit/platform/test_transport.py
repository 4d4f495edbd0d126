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
    app.rebalancing = False
    c._held_back.clear()
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

    sought: list[tuple[TP, int]] = []

    async def seek(partition: TP, offset: int) -> None:
        sought.append((partition, offset))

    async def earliest(_tp: TP) -> int:
        return 4

    consumer._read_offset[tp] = 13
    consumer.seek_to_committed = no_committed_offsets
    consumer.assignment = lambda: {tp}
    consumer._earliest_offset = earliest
    consumer.seek = seek
    try:
        await consumer.perform_seek()
    finally:
        for patched in ("seek_to_committed", "assignment", "_earliest_offset", "seek"):
            delattr(consumer, patched)
    assert consumer._read_offset[tp] is None
    # aiokafka would keep the position an earlier generation fetched up to: back to the start
    assert sought == [(tp, 4)]


#: The first offset the partition still holds (retention deleted those below it).
EARLIEST = [0]


async def earliest_offset(_tp: TP) -> int:
    return EARLIEST[0]


@pytest.fixture
def seeks(consumer: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[TP, int]]:
    """Seeks the head watch starts; the partition assigned, flowing, fetched up to offset 40."""
    done: list[tuple[TP, int]] = []

    async def seek(partition: TP, offset: int) -> None:
        done.append((partition, offset))

    monkeypatch.setattr(consumer, "seek", seek)
    monkeypatch.setattr(consumer, "assignment", lambda: {tp})
    monkeypatch.setattr(consumer, "highwater", lambda _tp: 40)
    monkeypatch.setattr(consumer, "_earliest_offset", earliest_offset)
    consumer._head_missing_since.clear()
    consumer._paused_partitions.clear()
    consumer._buffered_partitions.clear()
    consumer._read_offset.clear()
    return done


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(transport, "_now", lambda: now[0])
    return now


async def _seeks_after(consumer: Any, seeks: list[Any], clock: list[float], wait: float) -> list[Any]:
    """Let ``wait`` seconds pass, run one commit's head watch, and return the seeks so far."""
    clock[0] += wait
    assert consumer._new_offset(tp) is None
    await asyncio.sleep(0)
    return seeks


async def test_a_head_left_unacked_while_later_offsets_are_acked_is_fetched_again(
    consumer: Any, seeks: list[Any], clock: list[float]
) -> None:
    """Seen after a broker failover: committed=11 read=38 acked=[12..38], the head never came."""
    consumer._committed_offset[tp] = 11
    for offset in range(12, 39):
        consumer.ack(FakeMessage(offset=offset, generation_id=7))
    assert await _seeks_after(consumer, seeks, clock, 0) == []
    assert await _seeks_after(consumer, seeks, clock, transport.HEAD_RESEEK_S - 1) == []
    assert await _seeks_after(consumer, seeks, clock, 1) == [(tp, 11)]
    assert await _seeks_after(consumer, seeks, clock, 0) == [(tp, 11)]  # one seek per period
    consumer.ack(FakeMessage(offset=11, generation_id=7))  # fetched again and processed
    assert consumer._new_offset(tp) == 39
    assert tp not in consumer._head_missing_since


async def test_a_lost_last_message_is_fetched_again(
    consumer: Any, seeks: list[Any], clock: list[float]
) -> None:
    """Seen in the crash test: a record posted during a rebalance stayed ``submitted``; the
    partition had read its message (nothing after it), no stream held it, nothing acked it."""
    consumer._committed_offset[tp] = 39
    consumer._read_offset[tp] = 39
    assert await _seeks_after(consumer, seeks, clock, 0) == []
    assert await _seeks_after(consumer, seeks, clock, transport.HEAD_RESEEK_S) == [(tp, 39)]
    assert list(consumer._filter_tps_with_pending_acks()) == [tp], "watched with no acks at all"


async def test_a_head_a_stream_still_works_on_is_not_fetched_again(
    consumer: Any, seeks: list[Any], clock: list[float]
) -> None:
    """The chain submitter holds a head for as long as its transaction waits to be mined."""
    consumer._committed_offset[tp] = 11
    consumer._read_offset[tp] = 20
    for offset in range(12, 21):  # later keys of the partition finished
        consumer.ack(FakeMessage(offset=offset, generation_id=7))
    held = FakeMessage(offset=11, generation_id=7)
    consumer._unacked_messages.add(held)
    try:
        assert await _seeks_after(consumer, seeks, clock, 0) == []
        assert await _seeks_after(consumer, seeks, clock, 10 * transport.HEAD_RESEEK_S) == []
    finally:
        consumer._unacked_messages.discard(held)


@pytest.mark.parametrize(
    ("read", "highwater", "held_back"),
    [
        (38, 40, None),  # caught up to offset 38: the head (39) was not read yet
        (39, 39, None),  # the head does not exist yet (an idle partition just after a seek)
        (39, 40, "_paused_partitions"),  # recovery pauses it
        (39, 40, "_buffered_partitions"),  # its stream buffer is full
    ],
)
async def test_a_head_not_read_or_held_back_is_left_alone(
    consumer: Any,
    seeks: list[Any],
    clock: list[float],
    monkeypatch: pytest.MonkeyPatch,
    read: int,
    highwater: int,
    held_back: str | None,
) -> None:
    consumer._committed_offset[tp] = 39
    consumer._read_offset[tp] = read
    monkeypatch.setattr(consumer, "highwater", lambda _tp: highwater)
    if held_back:
        getattr(consumer, held_back).add(tp)
    assert await _seeks_after(consumer, seeks, clock, 0) == []
    assert await _seeks_after(consumer, seeks, clock, 10 * transport.HEAD_RESEEK_S) == []


async def test_the_head_of_a_partition_no_longer_assigned_is_left_alone(
    consumer: Any, seeks: list[Any], clock: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen after rebalances: a replica kept the start of ``claims[0]`` learned while it was
    being revoked and reported its head lost 15 s later, while another replica processed it."""
    consumer._committed_offset[tp] = 6
    consumer._read_offset[tp] = 30
    monkeypatch.setattr(consumer, "assignment", lambda: set())
    assert await _seeks_after(consumer, seeks, clock, 0) == []
    assert await _seeks_after(consumer, seeks, clock, 10 * transport.HEAD_RESEEK_S) == []
    assert not consumer._head_missing_since


@pytest.fixture
def broker_start(consumer: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The committed offset the broker reports for the partition (settable), and the count of lookups."""
    answer = [1]
    lookups: list[int] = []

    async def partition_start(_tp: TP) -> int:
        lookups.append(answer[0])
        return answer[0]

    monkeypatch.setattr(consumer, "_partition_start", partition_start)
    consumer._start_lookups.clear()
    return lookups


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_nothing_is_committed_before_the_partition_start_is_known(
    consumer: Any, seeks: list[Any], clock: list[float], broker_start: list[int]
) -> None:
    """Seen in the scale-out failover: a restarted replica knew no committed offset of
    ``review.task.finished[4]`` (the group's was 1), processed 14 and 15 first and committed 16:
    1..13 were never relayed. Now the commits wait for the start, and the head watch fetches it."""
    for offset in (14, 15):
        consumer.ack(FakeMessage(offset=offset, generation_id=7))
    assert consumer._new_offset(tp) is None
    await _settle()
    assert broker_start == [1] and consumer._committed_offset[tp] == 1
    assert await _seeks_after(consumer, seeks, clock, 0) == []
    assert await _seeks_after(consumer, seeks, clock, transport.HEAD_RESEEK_S) == [(tp, 1)]
    for offset in range(1, 14):  # fetched again and processed
        consumer.ack(FakeMessage(offset=offset, generation_id=7))
    assert consumer._new_offset(tp) == 16


async def test_a_start_learned_during_a_rebalance_is_not_kept(
    consumer: Any, seeks: list[Any], broker_start: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer.ack(FakeMessage(offset=5, generation_id=7))
    monkeypatch.setattr(consumer.app, "rebalancing", True)
    assert consumer._new_offset(tp) is None
    await _settle()
    assert broker_start == [1] and consumer._committed_offset[tp] is None  # asked again later
    monkeypatch.setattr(consumer.app, "rebalancing", False)
    assert consumer._new_offset(tp) is None
    await _settle()
    assert broker_start == [1, 1] and consumer._committed_offset[tp] == 1


async def test_acks_below_the_learned_start_are_dropped(
    consumer: Any, seeks: list[Any], broker_start: list[int]
) -> None:
    for offset in (0, 1, 2):
        consumer.ack(FakeMessage(offset=offset, generation_id=7))
    assert consumer._new_offset(tp) is None
    await _settle()
    assert consumer._committed_offset[tp] == 1 and consumer._acked[tp] == [1, 2]
    assert consumer._new_offset(tp) == 3


async def test_a_failed_lookup_is_asked_again_at_the_next_commit(
    consumer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    async def coordinator_moving(_tp: TP) -> int:
        calls.append(1)
        raise RuntimeError("NOT_COORDINATOR")

    monkeypatch.setattr(consumer, "_partition_start", coordinator_moving)
    monkeypatch.setattr(consumer, "assignment", lambda: {tp})
    consumer._start_lookups.clear()
    consumer.ack(FakeMessage(offset=5, generation_id=7))
    for _ in range(2):
        assert consumer._new_offset(tp) is None
        await _settle()
    assert len(calls) == 2 and consumer._committed_offset[tp] is None


async def test_offsets_a_fetch_jumped_over_stay_unacked_and_are_fetched_again(
    consumer: Any, seeks: list[Any], clock: list[float]
) -> None:
    """Seen in the scale-out failover: ``apply.created[1]`` read 3, then 17; faust counted 4..16
    as a gap the broker never delivers and committed them unprocessed (a record stayed submitted)."""
    consumer._committed_offset[tp] = 4
    await consumer._add_gap(tp, 4, 17)
    consumer.ack(FakeMessage(offset=17, generation_id=7))
    assert not consumer._gap[tp]
    assert await _seeks_after(consumer, seeks, clock, 0) == []
    assert await _seeks_after(consumer, seeks, clock, transport.HEAD_RESEEK_S) == [(tp, 4)]
    for offset in range(4, 17):
        consumer.ack(FakeMessage(offset=offset, generation_id=7))
    assert consumer._new_offset(tp) == 18


async def test_a_head_retention_deleted_is_skipped_over(
    consumer: Any, seeks: list[Any], clock: list[float]
) -> None:
    EARLIEST[0] = 30
    try:
        consumer._committed_offset[tp] = 20
        consumer.ack(FakeMessage(offset=30, generation_id=7))
        assert await _seeks_after(consumer, seeks, clock, 0) == []
        assert await _seeks_after(consumer, seeks, clock, transport.HEAD_RESEEK_S) == []
        assert consumer._new_offset(tp) == 31
    finally:
        EARLIEST[0] = 0


async def _rewinds_done(consumer: Any) -> None:
    await asyncio.gather(*consumer._rewinding.values())


@pytest.fixture
def fresh_rewinds(consumer: Any, seeks: list[Any]) -> list[Any]:
    consumer._rewinds.clear()
    consumer._rewinding.clear()
    consumer._delivered.clear()
    consumer._sought.clear()
    return seeks


async def test_a_fetch_that_jumps_ahead_is_not_delivered_but_fetched_again_in_order(
    consumer: Any, fresh_rewinds: list[Any]
) -> None:
    """Seen in the scale-out failover: ``claims[0]`` read up to 2, then 15; the retried
    application at 18 was claimed before the original request at 7, and one work got two records."""
    consumer._read_offset[tp] = 2
    consumer._delivered[tp] = 2
    assert consumer._jumped(tp, 15)
    assert consumer._jumped(tp, 16)  # the rest of the same fetch
    await _rewinds_done(consumer)
    assert fresh_rewinds == [(tp, 3)]
    consumer._read_offset[tp] = 3  # what faust's seek does
    assert not consumer._jumped(tp, 3)


async def test_after_a_seek_to_the_start_offset_zero_comes_first(
    consumer: Any, fresh_rewinds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def faust_seek(self: Any, partition: TP, offset: int) -> None:
        self._read_offset[partition] = offset if offset else None  # what faust's seek keeps

    monkeypatch.setattr(transport.faust_aiokafka.Consumer, "seek", faust_seek)
    consumer._delivered[tp] = 9
    await transport._Consumer.seek(consumer, tp, 0)
    assert consumer._jumped(tp, 5)
    await _rewinds_done(consumer)
    assert fresh_rewinds == [(tp, 0)]
    assert not consumer._jumped(tp, 0)


async def test_after_a_seek_the_seek_position_comes_first(consumer: Any, fresh_rewinds: list[Any]) -> None:
    consumer._read_offset[tp] = 7  # a seek (to the committed offset): 7 is next, not 8
    consumer._delivered[tp] = 2
    assert consumer._jumped(tp, 8)
    await _rewinds_done(consumer)
    assert fresh_rewinds == [(tp, 7)]
    assert not consumer._jumped(tp, 7)


async def test_in_order_and_redelivered_offsets_pass(consumer: Any, fresh_rewinds: list[Any]) -> None:
    consumer._read_offset[tp] = 10
    consumer._delivered[tp] = 10
    assert not consumer._jumped(tp, 11)
    assert not consumer._jumped(tp, 4)  # below: faust drops it as already read
    other = TP("avcc-code-records-changelog", 0)  # not a stream topic: compaction leaves gaps
    consumer._read_offset[other] = 3
    consumer._delivered[other] = 3
    assert not consumer._jumped(other, 9)
    assert not consumer._jumped(TP("avcc-code-records-changelog", 1), 9)  # nor an unknown start
    assert fresh_rewinds == []


async def test_a_fetch_with_the_next_offset_unknown_is_fetched_again_from_the_start(
    consumer: Any, fresh_rewinds: list[Any], broker_start: list[int]
) -> None:
    """Seen in the scale-out failover: a restarted replica claimed a retried application at
    ``claims[2]`` offset 65 before the original request at 5 (committed 5): two records. With no
    read offset and no seek known, nothing is delivered until the partition is sought to the
    group's committed offset (else its first offset)."""
    assert consumer._next_offset(tp) is None
    assert consumer._jumped(tp, 65)
    assert consumer._jumped(tp, 66)  # the rest of the same fetch
    await _rewinds_done(consumer)
    assert broker_start == [1] and fresh_rewinds == [(tp, 1)]
    consumer._read_offset[tp] = 1  # what faust's seek does
    assert not consumer._jumped(tp, 1)


async def test_a_start_sought_during_the_lookup_is_where_the_partition_is_fetched_again(
    consumer: Any, fresh_rewinds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in the scale-out failover: the seek to the committed offsets (4) finished while the
    lookup ran, the rewind then did not seek, and 4.. (dropped during the lookup) were lost."""

    async def partition_start(_tp: TP) -> int:
        consumer._read_offset[tp] = 4  # perform_seek sets the committed offset meanwhile
        return 1  # an older answer

    monkeypatch.setattr(consumer, "_partition_start", partition_start)
    assert consumer._jumped(tp, 9)
    assert consumer._jumped(tp, 4)  # fetched during the lookup: dropped
    await _rewinds_done(consumer)
    assert fresh_rewinds == [(tp, 4)]


async def test_an_unknown_start_is_asked_for_until_it_is_known(
    consumer: Any, fresh_rewinds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is delivered while the coordinator cannot answer; then the partition is sought."""
    answers: list[int | None] = [None, None, 6]

    async def coordinator_moving(_tp: TP) -> int:
        answer = answers.pop(0)
        if answer is None:
            raise RuntimeError("NOT_COORDINATOR")
        return answer

    monkeypatch.setattr(consumer, "_partition_start", coordinator_moving)
    monkeypatch.setattr(transport.asyncio, "sleep", _no_sleep)
    assert consumer._jumped(tp, 65)
    assert consumer._jumped(tp, 66)  # while it is asked: dropped
    await _rewinds_done(consumer)
    assert answers == [] and fresh_rewinds == [(tp, 6)]


_real_sleep = asyncio.sleep


async def _no_sleep(_seconds: float) -> None:
    await _real_sleep(0)


async def test_a_jump_over_offsets_retention_deleted_is_followed(
    consumer: Any, fresh_rewinds: list[Any]
) -> None:
    EARLIEST[0] = 30
    try:
        consumer._read_offset[tp] = 20
        consumer._delivered[tp] = 20
        assert consumer._jumped(tp, 35)
        await _rewinds_done(consumer)
        assert fresh_rewinds == [(tp, 30)]
    finally:
        EARLIEST[0] = 0


async def test_a_jump_that_keeps_coming_back_is_let_through(consumer: Any, fresh_rewinds: list[Any]) -> None:
    consumer._read_offset[tp] = 4
    consumer._delivered[tp] = 4
    for _ in range(transport.MAX_REWINDS):
        assert consumer._jumped(tp, 9)
        await _rewinds_done(consumer)
    assert not consumer._jumped(tp, 9)
    assert fresh_rewinds == [(tp, 5)] * transport.MAX_REWINDS


async def test_getmany_hands_streams_only_the_contiguous_run(
    consumer: Any, fresh_rewinds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched = [FakeMessage(offset=o, generation_id=7) for o in (3, 4, 9, 10, 5)]

    async def faust_getmany(self: Any, timeout: float) -> Any:  # noqa: ASYNC109 - faust's signature
        for message in fetched:
            yield tp, message
            # what faust's drain loop does with a delivered message
            if self._read_offset.get(tp) is None or message.offset >= self._read_offset[tp]:
                self._read_offset[tp] = message.offset

    monkeypatch.setattr(transport.faust_aiokafka.Consumer, "getmany", faust_getmany)
    consumer._read_offset[tp] = 3  # sought to 3
    delivered = [message.offset async for _, message in consumer.getmany(1.0)]
    await _rewinds_done(consumer)
    assert delivered == [3, 4]
    assert fresh_rewinds == [(tp, 5)]


async def test_stream_messages_fetched_while_rebalancing_are_held_back_and_fetched_again(
    consumer: Any, fresh_rewinds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen at a restart in the scale-out failover: a review replica got ``apply.created[0]``
    7..24 before its rebalance ended and processed none of them; 25.., fetched after, were."""
    changelog = TP("avcc-code-claims-changelog", 0)
    fetched = [(tp, FakeMessage(offset=o, generation_id=7)) for o in (7, 8)]
    fetched.append((changelog, FakeMessage(offset=3, generation_id=7, topic=changelog.topic, tp=changelog)))

    async def faust_getmany(self: Any, timeout: float) -> Any:  # noqa: ASYNC109 - faust's signature
        for partition, message in fetched:
            yield partition, message

    monkeypatch.setattr(transport.faust_aiokafka.Consumer, "getmany", faust_getmany)
    consumer._read_offset[tp] = 7  # the committed offset, sought by perform_seek
    monkeypatch.setattr(consumer.app, "rebalancing", True)
    delivered = [(p.topic, m.offset) async for p, m in consumer.getmany(1.0)]
    assert delivered == [(changelog.topic, 3)]  # recovery reads changelogs meanwhile
    assert consumer._held_back == {tp} and fresh_rewinds == []
    monkeypatch.setattr(consumer.app, "rebalancing", False)
    fetched[:] = [(tp, FakeMessage(offset=9, generation_id=7))]  # where the fetch went on
    assert [m.offset async for _, m in consumer.getmany(1.0)] == []  # a rewind runs first
    await _rewinds_done(consumer)
    assert fresh_rewinds == [(tp, 7)] and not consumer._held_back
    fetched[:] = [(tp, FakeMessage(offset=7, generation_id=7))]
    assert [m.offset async for _, m in consumer.getmany(1.0)] == [7]
