"""Window state of the anomaly group: per-partition snapshots in RocksDB and a compacted changelog.

The detector keeps one :class:`PartitionState` per owned partition of ``topic.playback.event``:
its open windows, its partial EWMA baseline, its watermark and the next offset to consume. At
every offset commit a snapshot of each changed partition is written

1. to a local RocksDB store (:class:`WindowStore`, key ``p:<partition>``), and
2. to the compacted topic :data:`CHANGELOG_TOPIC` (partition = the source partition, key = the
   partition number), with acks=all, waited for before the offsets are committed.

On assignment the snapshot of a partition is taken from the local store when its offset is at
least the group's committed offset (it is current), else from the changelog's last record of
that partition (:func:`read_changelog`), and the consumer seeks to the snapshot's offset: state
and position always match, whichever worker restores them. Snapshots hold only open windows
(pairs seen once left out, the biggest ``max_pairs`` kept) and the baseline (pruned, capped).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rocksdict import Rdict

from app.platform.errors import DependencyUnavailable
from app.playback.anomaly.rules import Baseline, WindowAgg

__all__ = [
    "CHANGELOG_TOPIC",
    "SNAPSHOT_VERSION",
    "PartitionState",
    "WindowStore",
    "ensure_changelog",
    "read_changelog",
]

log = logging.getLogger(__name__)

#: Compacted topic of window snapshots; one partition per source partition.
CHANGELOG_TOPIC: Final = "avcc-anomaly-window-changelog"
SNAPSHOT_VERSION: Final = 1
#: Snapshots can be big (open windows of a busy partition): allow 16 MiB records on the topic.
SNAPSHOT_MAX_BYTES: Final = 16 * 1024 * 1024
_TIMEOUT_S: Final = 30.0
_NO_LEADER: Final = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
    }
)


@dataclass(slots=True)
class PartitionState:
    """Detector state of one source partition."""

    partition: int
    #: Next offset to consume (``None``: nothing consumed since the state was created).
    offset: int | None = None
    #: Max event time seen in this partition (epoch ms; -1: none).
    watermark: int = -1
    #: Windows starting before this are closed: events for them are late (epoch ms).
    closed_until: int = 0
    windows: dict[int, WindowAgg] = field(default_factory=dict)
    baseline: Baseline = field(default_factory=Baseline)
    #: Late events dropped so far (diagnostics).
    late: int = 0
    #: Event ids of name-based (uuid5) events counted per open window, for dedup (not persisted).
    seen: dict[int, set[str]] = field(default_factory=dict)
    #: Changed since the last snapshot.
    dirty: bool = False

    def to_bytes(self, max_pairs: int) -> bytes:
        """The snapshot (JSON)."""
        return orjson.dumps(
            {
                "v": SNAPSHOT_VERSION,
                "partition": self.partition,
                "offset": self.offset,
                "watermark": self.watermark,
                "closed_until": self.closed_until,
                "late": self.late,
                "windows": {str(start): agg.to_json(max_pairs) for start, agg in self.windows.items()},
                "baseline": self.baseline.to_json(),
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> PartitionState:
        """Inverse of :meth:`to_bytes` (``ValueError`` for an unknown snapshot version)."""
        data: Mapping[str, Any] = orjson.loads(raw)
        if data.get("v") != SNAPSHOT_VERSION:
            raise ValueError(f"unknown anomaly snapshot version {data.get('v')!r}")
        offset = data.get("offset")
        return cls(
            partition=int(data["partition"]),
            offset=int(offset) if offset is not None else None,
            watermark=int(data.get("watermark", -1)),
            closed_until=int(data.get("closed_until", 0)),
            windows={int(k): WindowAgg.from_json(v) for k, v in data.get("windows", {}).items()},
            baseline=Baseline.from_json(data.get("baseline", {})),
            late=int(data.get("late", 0)),
        )


class WindowStore:
    """Local RocksDB copy of the latest snapshot of each partition (a cache of the changelog)."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = Rdict(str(path))

    @staticmethod
    def _key(partition: int) -> str:
        return f"p:{partition}"

    def get(self, partition: int) -> bytes | None:
        """The stored snapshot of ``partition``."""
        value = self._db.get(self._key(partition))
        return bytes(value) if value is not None else None

    def put(self, partition: int, snapshot: bytes) -> None:
        """Store the snapshot of ``partition``."""
        self._db[self._key(partition)] = snapshot

    def close(self) -> None:
        """Flush and release the database lock."""
        self._db.flush()
        self._db.close()


def ensure_changelog(
    client_config: Mapping[str, Any],
    partitions: int,
    *,
    topic: str = CHANGELOG_TOPIC,
    replication_factor: int = 1,
) -> bool:
    """Create the compacted changelog topic if missing; ``True`` when it was created.

    An existing topic with another partition count is refused (``ValueError``): snapshots are
    addressed by partition number.
    """
    admin = AdminClient(dict(client_config))
    metadata = admin.list_topics(timeout=_TIMEOUT_S)
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None:
        if len(existing.partitions) != partitions:
            raise ValueError(
                f"{topic} has {len(existing.partitions)} partitions, the source topic {partitions}: "
                "delete it (it is rebuilt from the next snapshots) or fix the plan"
            )
        return False
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config={"cleanup.policy": "compact", "max.message.bytes": str(SNAPSHOT_MAX_BYTES)},
    )
    for name, future in admin.create_topics([new], operation_timeout=_TIMEOUT_S).items():
        try:
            future.result(timeout=_TIMEOUT_S)
        except Exception as exc:  # KafkaException: a concurrent worker may have created it
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise DependencyUnavailable(f"cannot create {name}: {exc}") from exc
    log.info("created compacted changelog %s (%d partitions)", topic, partitions)
    return True


def read_changelog(
    client_config: Mapping[str, Any],
    partitions: Iterable[int],
    *,
    topic: str = CHANGELOG_TOPIC,
    timeout_s: float = 20.0,
) -> dict[int, bytes]:
    """The last snapshot record of each of ``partitions`` in the changelog (absent: none).

    Reads from just before each partition's reported end up to the real end (some brokers report
    a stale end offset, so it reads on until the broker says end-of-partition).
    """
    wanted = sorted(set(partitions))
    if not wanted:
        return {}
    conf = dict(client_config)
    conf.update(
        {
            "group.id": "avcc-anomaly-restore",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.message.max.bytes": SNAPSHOT_MAX_BYTES,
        }
    )
    consumer = Consumer(conf)
    latest: dict[int, bytes] = {}
    try:
        assignment: list[TopicPartition] = []
        for partition in wanted:
            low, high = _watermarks(consumer, TopicPartition(topic, partition))
            if high > low:
                assignment.append(TopicPartition(topic, partition, max(low, high - 1)))
        if not assignment:
            return {}
        consumer.assign(assignment)
        pending = {tp.partition for tp in assignment}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=100, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(message.partition())
                        continue
                    raise DependencyUnavailable(f"reading {topic}: {error.str()}")
                value = message.value()
                if value is not None:
                    latest[int(message.partition())] = bytes(value)
        unread = sorted(pending - latest.keys())
        if unread:
            raise DependencyUnavailable(f"changelog {topic}: partitions {unread} unreadable in {timeout_s} s")
        if pending:
            log.warning("changelog %s: no end of partition %s in %.0f s", topic, sorted(pending), timeout_s)
    finally:
        consumer.close()
    return latest


def _watermarks(consumer: Consumer, tp: TopicPartition, attempts: int = 20) -> tuple[int, int]:
    """Low/high offsets of ``tp``, retrying the transient errors of a fresh topic (no leader yet)."""
    for attempt in range(attempts):
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10.0)
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, KafkaError) and (error.retriable() or error.code() in _NO_LEADER)
            if not retriable or attempt == attempts - 1:
                raise DependencyUnavailable(f"offsets of {tp.topic}[{tp.partition}]: {exc}") from exc
            time.sleep(0.5)
    raise AssertionError("unreachable")
