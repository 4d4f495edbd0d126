"""Reads of a topic that end at something observable, never after an idle wait.

A read that stops after "a second without new messages" passes whether or not a message was
still on its way, so it cannot prove that nothing was produced. These reads end instead at:

* the end offsets of the topic at a chosen moment (:func:`end_offsets`, :func:`read_range`),
* a sentinel: a message produced after the action under test, through the same path, that the
  read waits for (:func:`read_to_sentinel`); what the action produced is before it,
* a consumer group's committed offsets (:func:`wait_committed`): a core agent commits only what
  it has processed and whose outputs the broker acknowledged.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

__all__ = [
    "committed",
    "end_offsets",
    "group_offsets",
    "read_range",
    "read_to_sentinel",
    "wait_committed",
    "wait_quiescent",
]


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


def _partitions(admin: AdminClient, topic: str) -> list[int]:
    return sorted(admin.list_topics(topic, timeout=10).topics[topic].partitions)


def _offsets(admin: AdminClient, topic: str, partitions: Iterable[int], spec: OffsetSpec) -> dict[int, int]:
    """The first (``OffsetSpec.earliest()``) or end (``latest()``) offset of each partition, in
    one request per leader; asked again while a leader is still being elected (a topic just
    created) or moving."""
    request = {TopicPartition(topic, p): spec for p in partitions}
    deadline = time.monotonic() + 30
    while True:
        try:
            futures = admin.list_offsets(request, request_timeout=10)
            return {tp.partition: int(future.result().offset) for tp, future in futures.items()}
        except KafkaException as exc:
            error = exc.args[0]
            if (not error.retriable() and error.code() not in _NOT_YET) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


_NOT_YET = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT,
}


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The end offset (high watermark) of each partition of ``topic`` now."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return _offsets(admin, topic, _partitions(admin, topic), OffsetSpec.latest())


class _Reader:
    """One topic read from ``start`` (default: each partition's first offset), partition EOFs tracked."""

    def __init__(self, bootstrap: str, topic: str, start: Mapping[int, int] | None) -> None:
        self.topic = topic
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.consumer = _consumer(bootstrap)
        self.partitions = _partitions(self.admin, topic)
        firsts = _offsets(self.admin, topic, self.partitions, OffsetSpec.earliest()) if not start else {}
        offsets = {p: start[p] if start and p in start else firsts.get(p, 0) for p in self.partitions}
        self.consumer.assign([TopicPartition(topic, p, offsets[p]) for p in self.partitions])
        #: Offset each partition was last seen to end at (its EOF), or read up to.
        self.reached = dict(offsets)
        self.messages: list[Message] = []

    def ends_now(self) -> dict[int, int]:
        return _offsets(self.admin, self.topic, self.partitions, OffsetSpec.latest())

    def read_to(self, ends: Mapping[int, int], deadline: float) -> None:
        """Read until every partition was read up to ``ends`` (AssertionError past ``deadline``)."""
        while any(self.reached[p] < ends[p] for p in self.partitions):
            if time.monotonic() > deadline:
                behind = {p: (self.reached[p], ends[p]) for p in self.partitions if self.reached[p] < ends[p]}
                raise AssertionError(f"{self.topic}: not read to its end offsets in time: {behind}")
            for message in self.consumer.consume(1000, 0.2):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    self.reached[message.partition()] = max(
                        self.reached[message.partition()], message.offset()
                    )
                    continue
                self.messages.append(message)
                self.reached[message.partition()] = max(
                    self.reached[message.partition()], message.offset() + 1
                )

    def close(self) -> None:
        self.consumer.close()


def read_range(
    bootstrap: str,
    topic: str,
    *,
    start: Mapping[int, int] | None = None,
    end: Mapping[int, int] | None = None,
    timeout_s: float = 60.0,
) -> list[Message]:
    """Every message of ``topic`` from ``start`` (default: the beginning) up to ``end`` (default:
    the end offsets when the read starts)."""
    reader = _Reader(bootstrap, topic, start)
    try:
        reader.read_to(end if end is not None else reader.ends_now(), time.monotonic() + timeout_s)
        return [m for m in reader.messages if end is None or m.offset() < end.get(m.partition(), 0)]
    finally:
        reader.close()


def read_to_sentinel(
    bootstrap: str,
    topic: str,
    is_sentinel: Callable[[Message], bool],
    *,
    sentinels: int = 1,
    start: Mapping[int, int] | None = None,
    timeout_s: float = 60.0,
) -> list[Message]:
    """Every message of ``topic`` from ``start`` until ``sentinels`` messages matching
    ``is_sentinel`` have arrived, and on up to the end offsets taken at that moment (so the other
    partitions are read as far); the sentinels themselves are left out.

    Produce the sentinel after the action under test, through the path the action's output would
    take: whatever that output was, it is in the answer.
    """
    reader = _Reader(bootstrap, topic, start)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            reader.read_to(reader.ends_now(), deadline)
            found = sum(1 for m in reader.messages if is_sentinel(m))
            if found >= sentinels:
                reader.read_to(reader.ends_now(), deadline)
                return [m for m in reader.messages if not is_sentinel(m)]
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: {found} of {sentinels} sentinels arrived in {timeout_s:g}s")
            time.sleep(0.1)
    finally:
        reader.close()


def committed(bootstrap: str, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """The offsets ``group`` committed on ``topic`` (-1 where it has none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        return {tp.partition: int(tp.offset) for tp in consumer.committed(tps, timeout=10)}
    finally:
        consumer.close()


def wait_committed(
    bootstrap: str, group: str, topic: str, offsets: Mapping[int, int], timeout_s: float = 90.0
) -> None:
    """Wait until ``group`` has committed at least ``offsets`` on ``topic`` (what it processed, its
    outputs acknowledged first)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = committed(bootstrap, group, topic, offsets)
        except Exception as exc:  # the coordinator loading or moving
            last = exc
        else:
            if all(last[p] >= o for p, o in offsets.items()):
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"{group} did not commit {dict(offsets)} on {topic}: {last}")
        time.sleep(0.2)


def group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """Every offset ``group`` has committed, by ``(topic, partition)``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [ConsumerGroupTopicPartitions(group)]
    answer = admin.list_consumer_group_offsets(request, request_timeout=10)[group].result(timeout=15)
    return {(tp.topic, tp.partition): int(tp.offset) for tp in answer.topic_partitions if tp.offset >= 0}


def wait_quiescent(bootstrap: str, groups: Iterable[str], timeout_s: float = 120.0) -> None:
    """Wait until each of ``groups`` has committed the end offset of every partition it commits
    on, twice in a row with the same end offsets: everything produced to their topics (their
    own outputs included) is processed and nothing is on its way between them."""
    groups = list(groups)
    deadline = time.monotonic() + timeout_s
    admin = AdminClient({"bootstrap.servers": bootstrap})
    previous: dict[tuple[str, int], int] | None = None
    last: Any = None
    while True:
        try:
            commits = {group: group_offsets(bootstrap, group) for group in groups}
            wanted: dict[str, set[int]] = {}
            for offsets in commits.values():
                for topic, partition in offsets:
                    wanted.setdefault(topic, set()).add(partition)
            ends: dict[tuple[str, int], int] = {
                (topic, p): end
                for topic, partitions in wanted.items()
                for p, end in _offsets(admin, topic, partitions, OffsetSpec.latest()).items()
            }
            behind: dict[str, dict[tuple[str, int], tuple[int, int]]] = {}
            for group, offsets in commits.items():
                for tp, offset in offsets.items():
                    if offset < ends[tp]:
                        behind.setdefault(group, {})[tp] = (offset, ends[tp])
            last = behind
            if not behind and ends == previous:
                return
            previous = ends if not behind else None
        except KafkaException as exc:  # a coordinator loading or moving
            last, previous = exc, None
        if time.monotonic() > deadline:
            raise AssertionError(f"{groups} not caught up in {timeout_s:g}s: {last}")
        time.sleep(0.5)
