"""Bulk reading of changelog partitions in a thread: the fast path of table recovery and standbys.

A :class:`ChangelogReader` owns one confluent-kafka consumer (manually assigned, never joining a
group, never committing) and a thread that fetches many thousand messages at a time from the
partitions it is given, and hands them, grouped by partition, to an ``apply`` callback. Each
partition is a :class:`ChangelogRange`:

* **bounded** (``end`` set): read from ``position`` to ``end`` (exclusive), then done — the
  restore of a table partition up to the high watermark it had when it was assigned;
* **following** (``end`` ``None``): read on as the changelog grows — a standby's warm copy.

The caller adds and removes ranges at any time (a rebalance); :meth:`ChangelogReader.remove`
returns only once no message of a removed partition will be applied any more, so its store can
be closed. Progress (position, high watermark, records applied, rate) is kept per range and read
from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

__all__ = ["FETCH_MESSAGES", "Change", "ChangelogRange", "ChangelogReader", "TopicPartitionKey"]

log = logging.getLogger(__name__)

#: Messages one fetch of the reader asks for.
FETCH_MESSAGES: Final = 10_000
#: Longest wait of one fetch when nothing arrives (also how soon a stop or a change is seen).
POLL_S: Final = 0.2

#: The settings of the reader's consumer its admin client shares (connection and security).
_ADMIN_KEYS: Final = frozenset(
    {
        "bootstrap.servers",
        "client.id",
        "security.protocol",
        "sasl.mechanism",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
    }
)

#: A changelog partition: ``(topic, partition)``.
TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Change:
    """One changelog message: what a store needs to restore it."""

    offset: int
    key: bytes
    value: bytes | None


@dataclass(slots=True)
class ChangelogRange:
    """What the reader reads of one partition, and how far it got."""

    topic: str
    partition: int
    #: Next offset to apply.
    position: int
    #: First offset not to read (``None``: follow the partition as it grows).
    end: int | None
    #: The partition's high watermark as last seen (the end of a bounded range until then).
    high: int = 0
    #: Messages applied so far.
    applied: int = 0
    started: float = field(default_factory=time.monotonic)
    #: When a bounded range was done, or a following one first caught up.
    caught_up_at: float | None = None

    @property
    def key(self) -> TopicPartitionKey:
        """``(topic, partition)``."""
        return (self.topic, self.partition)

    @property
    def done(self) -> bool:
        """A bounded range read to its end."""
        return self.end is not None and self.position >= self.end

    @property
    def remaining(self) -> int:
        """Messages (offsets) still to read: to the end, or to the high watermark."""
        target = self.end if self.end is not None else self.high
        return max(0, target - self.position)

    def rate(self, now: float | None = None) -> float:
        """Messages applied per second since the range started."""
        elapsed = (now if now is not None else time.monotonic()) - self.started
        return self.applied / elapsed if elapsed > 0 else 0.0


#: Applies a partition's changes to its store (called on the reader's thread, in offset order).
Apply = Callable[[TopicPartitionKey, list[Change]], None]
#: Told (on the reader's thread) that a bounded range is done or a following one caught up.
Reached = Callable[[ChangelogRange], None]


class ChangelogReader:
    """Reads the ranges it is given on its own thread (see the module doc)."""

    def __init__(self, config: Mapping[str, Any], apply: Apply, reached: Reached, *, name: str) -> None:
        """``config``: librdkafka settings (bootstrap, security, ``group.id`` for the client)."""
        self.name = name
        self._config = {
            **config,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 8 << 20,
            "queued.max.messages.kbytes": 256 << 10,
        }
        self._apply = apply
        self._reached = reached
        self._ranges: dict[TopicPartitionKey, ChangelogRange] = {}
        #: Guards ``_ranges`` and the assignment; held by the thread while it applies a fetch.
        self._lock = threading.Lock()
        self._assigned: dict[TopicPartitionKey, ChangelogRange] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._admin: Any = None
        self.errors = 0

    # -- what to read ---------------------------------------------------------------------

    def ranges(self) -> list[ChangelogRange]:
        """A snapshot of the ranges being read."""
        with self._lock:
            return list(self._ranges.values())

    def get(self, key: TopicPartitionKey) -> ChangelogRange | None:
        """The range of ``key``, if it is read."""
        return self._ranges.get(key)

    def add(self, ranges: Iterable[ChangelogRange]) -> None:
        """Read ``ranges`` (replacing the ranges of the same partitions); starts the thread."""
        with self._lock:
            for changelog_range in ranges:
                changelog_range.high = max(changelog_range.high, changelog_range.end or 0)
                self._ranges[changelog_range.key] = changelog_range
        self._wake.set()
        self._ensure_thread()

    def remove(self, keys: Iterable[TopicPartitionKey]) -> list[ChangelogRange]:
        """Stop reading ``keys``; once this returns, none of their messages is applied any more
        (it waits for a fetch being applied). The ranges removed."""
        removed: list[ChangelogRange] = []
        with self._lock:
            for key in keys:
                found = self._ranges.pop(key, None)
                if found is not None:
                    removed.append(found)
        self._wake.set()
        return removed

    def high_watermarks(
        self, keys: Iterable[TopicPartitionKey], timeout_s: float
    ) -> dict[TopicPartitionKey, int]:
        """The high watermark of each of ``keys``, asked of the broker in one batched request by
        a client of its own (the reader's consumer may be busy with large fetches): blocking,
        raising when the broker does not answer within ``timeout_s`` or refuses (a new client
        is made for the next ask then)."""
        if self._admin is None:
            self._admin = AdminClient({k: v for k, v in self._config.items() if k in _ADMIN_KEYS})
        wanted = {TopicPartition(topic, partition): OffsetSpec.latest() for topic, partition in keys}
        if not wanted:
            return {}
        futures = self._admin.list_offsets(wanted, request_timeout=timeout_s)
        try:
            return {
                (tp.topic, tp.partition): int(f.result(timeout=timeout_s).offset) for tp, f in futures.items()
            }
        except Exception:
            # a leader that moved (FENCED_LEADER_EPOCH, NOT_LEADER): the next ask starts from fresh
            # metadata rather than the client's cached leaders
            self._admin = None
            raise

    # -- the thread -----------------------------------------------------------------------

    def _client(self) -> Any:
        if self._consumer is None:
            self._consumer = Consumer(self._config)
        return self._consumer

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"changelog-reader-{self.name}", daemon=True
            )
            self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and close the consumer."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        if self._consumer is not None and (thread is None or not thread.is_alive()):
            self._consumer.close()
            self._consumer = None

    def _sync_assignment(self, consumer: Any) -> None:
        """Assign the partitions of new (or replaced) ranges at their positions, unassign the
        partitions of ranges removed or done."""
        with self._lock:
            wanted = {key: r for key, r in self._ranges.items() if not r.done}
        stale = [key for key, r in self._assigned.items() if wanted.get(key) is not r]
        if stale:
            consumer.incremental_unassign([TopicPartition(t, p) for t, p in stale])
        new = [r for key, r in wanted.items() if self._assigned.get(key) is not r]
        if new:
            consumer.incremental_assign([TopicPartition(r.topic, r.partition, r.position) for r in new])
        self._assigned = wanted

    def _run(self) -> None:
        consumer = self._client()
        while not self._stop.is_set():
            if self._wake.is_set():
                self._wake.clear()
                self._sync_assignment(consumer)
            if not self._assigned:
                self._wake.wait(POLL_S)
                continue
            try:
                messages = consumer.consume(FETCH_MESSAGES, timeout=POLL_S)
            except Exception:  # the consumer closing under us: the loop ends at the stop check
                log.exception("%s: changelog fetch failed", self.name)
                self.errors += 1
                time.sleep(POLL_S)
                continue
            self._handle(consumer, messages)

    def _handle(self, consumer: Any, messages: list[Any]) -> None:
        """Group a fetch by partition, apply each partition's new messages, note ends reached."""
        by_key: dict[TopicPartitionKey, list[Change]] = {}
        eof: dict[TopicPartitionKey, int] = {}
        for message in messages:
            error = message.error()
            key = (message.topic(), message.partition())
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    eof[key] = int(message.offset())
                else:
                    self.errors += 1
                    log.warning("%s: changelog fetch error on %s[%d]: %s", self.name, *key, error)
                continue
            changes = by_key.get(key)
            if changes is None:
                changes = by_key[key] = []
            changes.append(Change(message.offset(), message.key(), message.value()))
        finished: list[ChangelogRange] = []
        with self._lock:
            for key, changes in by_key.items():
                current = self._ranges.get(key)
                if current is None or current.done:
                    continue
                kept = [
                    c
                    for c in changes
                    if c.offset >= current.position and (current.end is None or c.offset < current.end)
                ]
                if kept:
                    self._apply(key, kept)
                    current.applied += len(kept)
                    current.position = kept[-1].offset + 1
                if current.end is not None and changes[-1].offset + 1 >= current.end:
                    current.position = max(current.position, current.end)
            now = time.monotonic()
            for key, current in self._ranges.items():
                if key in eof:
                    current.high = max(current.high, eof[key])
                    current.position = max(current.position, min(eof[key], current.end or eof[key]))
                elif current.end is None and key in by_key:
                    _, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
                    if high is not None and high >= 0 and high != OFFSET_END:
                        current.high = max(current.high, int(high))
                if current.caught_up_at is None and (current.done or (current.end is None and key in eof)):
                    current.caught_up_at = now
                    finished.append(current)
        if any(r.done for r in finished):
            self._wake.set()
        for changelog_range in finished:
            self._reached(changelog_range)
