"""Offsets reader: a :class:`LagSnapshot` of every consumer group, read with confluent-kafka clients.

Groups come from ``AdminClient.list_consumer_groups``, group state from
``describe_consumer_groups``, committed offsets from a never-subscribing consumer of each group
(``Consumer.committed``; the admin ``list_consumer_group_offsets`` can crash librdkafka, see
:meth:`OffsetReader._committed`), end offsets from ``get_watermark_offsets``. A committed offset
past the reported end never yields a negative lag (clamped to 0).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, TopicPartition

from app.platform.errors import AvccError
from app.platform.kafka.clients import admin_client, consumer_config
from app.platform.lag.settings import get_lag_read_settings
from app.platform.lag.snapshot import BROKER_ERROR, GroupState, LagSnapshot, PartitionOffsets
from app.platform.metrics import LAG_MONITOR_ERRORS
from app.platform.settings import Settings

__all__ = ["LAG_READER_GROUP", "OffsetReader", "ReaderAborted", "WatchedGroups"]

log = logging.getLogger(__name__)

#: Most group consumers kept open between snapshots (least recently used ones are closed).
_MAX_GROUP_CLIENTS = 64
#: The group id of the watermark consumer; it never subscribes nor commits, so it never shows.
LAG_READER_GROUP: Final = "avcc-lag-reader"


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # closing a client that lost its broker must not raise
        log.debug("closing %r failed", client, exc_info=True)


class ReaderAborted(AvccError):
    """A read stopped because the reader was aborted or closed meanwhile."""


@dataclass(frozen=True, slots=True)
class WatchedGroups:
    """The consumer groups a :meth:`OffsetReader.snapshot` reads: every group whose id starts with
    ``prefix`` (``""``: all of them), and the ``(group, topic)`` pairs that show even before the
    group's first commit (an alert rule's)."""

    prefix: str = ""
    pairs: frozenset[tuple[str, str]] = frozenset()


class OffsetReader:
    """Reads group offsets and end offsets with confluent-kafka clients (blocking; call in a thread)."""

    def __init__(
        self,
        settings: Settings,
        *,
        request_timeout_s: float | None = None,
        watched: WatchedGroups = WatchedGroups(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.request_timeout_s = (
            request_timeout_s if request_timeout_s is not None else get_lag_read_settings().request_timeout_s
        )
        self.watched = watched
        self.clock = clock
        self._lock = threading.Lock()
        #: Set by :meth:`abort` and :meth:`close` (from another thread): a read under way stops
        #: at its next request. With the broker gone each request waits its whole timeout, and a
        #: snapshot asks about every partition in turn: minutes (an ops worker took 6 min to stop
        #: after a SIGKILLed dev stack took its broker down).
        self._aborted = threading.Event()
        self._admin: Any = None
        self._consumer: Any = None
        self._group_consumers: OrderedDict[str, Any] = OrderedDict()

    # -- clients -----------------------------------------------------------------

    def _admin_client(self) -> Any:
        if self._admin is None:
            self._admin = admin_client(self.settings)
        return self._admin

    def _watermark_consumer(self) -> Any:
        if self._consumer is None:
            # Never subscribes nor commits: the group id only satisfies librdkafka.
            self._consumer = Consumer(consumer_config(self.settings, LAG_READER_GROUP, LAG_READER_GROUP))
        return self._consumer

    def abort(self) -> None:
        """Have a read under way stop at its next request (it returns an error snapshot)."""
        self._aborted.set()

    def close(self) -> None:
        """Stop a read under way, then close the clients (idempotent; the reader may be used again)."""
        self.abort()
        with self._lock:
            if self._consumer is not None:
                _close_quietly(self._consumer)
                self._consumer = None
            while self._group_consumers:
                _close_quietly(self._group_consumers.popitem()[1])
            self._admin = None
            self._aborted.clear()

    def _check_aborted(self) -> None:
        if self._aborted.is_set():
            raise ReaderAborted("the offset reader was closed during the read")

    # -- reads -------------------------------------------------------------------

    def snapshot(self) -> LagSnapshot:
        """Offsets of every watched group (:class:`WatchedGroups`)."""
        with self._lock:
            try:
                return self._snapshot()
            except Exception as exc:  # any client failure becomes an ERR snapshot, never a crash
                LAG_MONITOR_ERRORS.labels(stage="snapshot").inc()
                log.warning("lag snapshot failed: %s", exc)
                return LagSnapshot(self.clock(), errors={BROKER_ERROR: f"{type(exc).__name__}: {exc}"})

    def group_offsets(self, group: str, partitions: Iterable[tuple[str, int]]) -> list[PartitionOffsets]:
        """Offsets of ``group`` on the given partitions (what one worker exports for itself)."""
        tps = sorted(set(partitions))
        if not tps:
            return []
        with self._lock:
            committed = self._committed(group, tps)
            marks = self._watermarks(tps)
        return [
            PartitionOffsets(group, t, p, marks[(t, p)][1], committed.get((t, p)), marks[(t, p)][0])
            for t, p in tps
            if (t, p) in marks
        ]

    def _committed(self, group: str, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        """Committed offsets of ``group`` (``None``: never committed), via a consumer of that group.

        Not ``AdminClient.list_consumer_group_offsets``: librdkafka (up to at least 2.12) crashes the
        process when that request meets a NOT_COORDINATOR answer (librdkafka#5040), which happens
        while a coordinator moves (fresh cluster, broker restart). A consumer with the group's id
        handles it; it never subscribes, so it never joins the group.
        """
        if not tps:
            return {}
        consumer = self._group_consumers.pop(group, None)
        if consumer is None:
            # reads the group's committed offsets only (never joins it)
            consumer = Consumer(consumer_config(self.settings, group, LAG_READER_GROUP))
        self._group_consumers[group] = consumer  # most recently used last
        while len(self._group_consumers) > _MAX_GROUP_CLIENTS:
            _, oldest = self._group_consumers.popitem(last=False)
            _close_quietly(oldest)
        result = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=self.request_timeout_s)
        offsets: dict[tuple[str, int], int | None] = {}
        for tp in result:
            if tp.error is not None:
                raise RuntimeError(f"committed offset of {tp.topic}[{tp.partition}]: {tp.error}")
            offsets[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
        return offsets

    def _snapshot(self) -> LagSnapshot:
        admin = self._admin_client()
        timeout = self.request_timeout_s
        taken_at = self.clock()
        listing = admin.list_consumer_groups(request_timeout=timeout).result(timeout=timeout + 5)
        prefix = self.watched.prefix
        listed = {g.group_id: g for g in listing.valid}
        group_ids = {g for g in listed if g.startswith(prefix)}
        group_ids.discard(LAG_READER_GROUP)
        rule_pairs = set(self.watched.pairs)
        group_ids |= {group for group, _ in rule_pairs}
        errors: dict[str, str] = {}

        groups: dict[str, GroupState] = {}
        if group_ids:
            self._check_aborted()
            described = admin.describe_consumer_groups(sorted(group_ids), request_timeout=timeout)
            for group, future in described.items():
                try:
                    description = future.result(timeout=timeout + 5)
                    state = getattr(description.state, "name", str(description.state))
                    groups[group] = GroupState(group, state, len(description.members))
                except Exception as exc:  # fall back on the listing: absent there = no such group
                    log.debug("describe %s failed: %s", group, exc)
                    if group not in listed:
                        groups[group] = GroupState(group, "DEAD", 0)
                    else:
                        state = getattr(listed[group].state, "name", "UNKNOWN")
                        groups[group] = GroupState(group, state)

        self._check_aborted()
        metadata = admin.list_topics(timeout=timeout)
        partitions_of = {
            name: sorted(meta.partitions)
            for name, meta in metadata.topics.items()
            if not meta.error and not name.startswith("__")
        }
        every_tp = [(topic, p) for topic in sorted(partitions_of) for p in partitions_of[topic]]
        committed: dict[str, dict[tuple[str, int], int | None]] = {}
        for group in sorted(group_ids):
            self._check_aborted()
            if group not in listed and groups.get(group, GroupState(group)).state == "DEAD":
                committed[group] = {}  # no such group: nothing committed (and no request to make)
                continue
            try:
                committed[group] = {
                    tp: offset
                    for tp, offset in self._committed(group, every_tp).items()
                    if offset is not None
                }
            except Exception as exc:  # this group's offsets are unknown: its rows show ERR
                errors[group] = f"{type(exc).__name__}: {exc}"
                LAG_MONITOR_ERRORS.labels(stage="group_offsets").inc()
        for group in [g for g in self._group_consumers if g not in group_ids]:
            _close_quietly(self._group_consumers.pop(group))

        wanted: dict[str, set[str]] = {}
        for group, offsets in committed.items():
            for topic, _ in offsets:
                wanted.setdefault(group, set()).add(topic)
        for group, topic in rule_pairs:
            wanted.setdefault(group, set()).add(topic)
        tps = sorted(
            {
                (topic, p)
                for topics in wanted.values()
                for topic in topics
                if topic in partitions_of
                for p in partitions_of[topic]
            }
        )
        marks = self._watermarks(tps)
        rows: list[PartitionOffsets] = []
        for group in sorted(wanted):
            offsets = committed.get(group, {})
            for topic in sorted(wanted[group]):
                for partition in partitions_of.get(topic, []):
                    if (topic, partition) in marks:
                        low, high = marks[(topic, partition)]
                        committed_offset = offsets.get((topic, partition))
                        rows.append(PartitionOffsets(group, topic, partition, high, committed_offset, low))
        return LagSnapshot(taken_at, tuple(rows), groups, errors)

    def _watermarks(self, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """``(low, end)`` of each partition (partitions without a leader now are left out)."""
        consumer = self._watermark_consumer()
        timeout = self.request_timeout_s
        marks: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, partition in tps:
            self._check_aborted()
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout, cached=False
                )
            except Exception as exc:  # a partition without a leader right now: skip it this round
                log.debug("watermarks of %s[%d] failed: %s", topic, partition, exc)
                continue
            marks[(topic, partition)] = (int(low), int(high))
        return marks
