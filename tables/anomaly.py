"""State of the anomaly group: per-partition window snapshots in RocksDB and a compacted changelog.

What backs it: NOT a faust table (the anomaly group's faust App runs without Kafka and declares
no tables). The detector keeps one :class:`~app.playback.anomaly.windows.PartitionState` per
owned partition of ``topic.playback.event`` in memory -- its open windows, its partial EWMA
baseline, its watermark and the next offset to consume -- and at every offset commit writes a
snapshot of each changed partition

1. to a local RocksDB store opened with rocksdict (:class:`WindowStore`, key ``p:<partition>``,
   at :func:`window_store_dir`: ``<data_dir>/workers/anomaly/windows`` unless configured), and
2. to the compacted topic :data:`CHANGELOG_TOPIC` (the plan's ``ANOMALY_WINDOW_CHANGELOG``;
   partition = the source partition, key = the partition number), with acks=all, waited for
   before the offsets are committed.

On assignment the snapshot of a partition is taken from the local store when its offset is at
least the group's committed offset (it is current), else from the changelog's last record of
that partition (:func:`read_changelog`), and the consumer seeks to the snapshot's offset: state
and position always match, whichever worker restores them. Snapshots hold only open windows
(pairs seen once left out, the biggest ``max_pairs`` kept) and the baseline (pruned, capped).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic
from rocksdict import Rdict

from app.platform.errors import DependencyUnavailable
from app.platform.kafka.clients import admin_client, consumer_config
from app.platform.settings import Settings
from app.platform.topics import ANOMALY_WINDOW_CHANGELOG
from app.playback.anomaly.windows import SNAPSHOT_VERSION, PartitionState

__all__ = [
    "CHANGELOG_TOPIC",
    "RESTORE_GROUP",
    "SNAPSHOT_MAX_BYTES",
    "SNAPSHOT_VERSION",
    "PartitionState",
    "WindowStore",
    "ensure_changelog",
    "read_changelog",
    "window_store_dir",
]

log = logging.getLogger(__name__)

#: Compacted topic of window snapshots; one partition per source partition.
CHANGELOG_TOPIC: Final = ANOMALY_WINDOW_CHANGELOG.name
#: Snapshots can be big (open windows of a busy partition): allow 16 MiB records on the topic.
SNAPSHOT_MAX_BYTES: Final = 16 * 1024 * 1024
#: Consumer group id of the changelog reads on restore (assign only: it never joins or commits).
RESTORE_GROUP: Final = "avcc-anomaly-restore"
_TIMEOUT_S: Final = 30.0
_NO_LEADER: Final = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
    }
)


def window_store_dir(settings: Settings, configured: Path | None = None) -> Path:
    """Where the local snapshot store lives: ``configured``, else under the data directory."""
    return configured if configured is not None else settings.data_dir / "workers" / "anomaly" / "windows"


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
    settings: Settings,
    partitions: int,
    *,
    topic: str = CHANGELOG_TOPIC,
    replication_factor: int | None = None,
) -> bool:
    """Create the compacted changelog topic if missing; ``True`` when it was created.

    An existing topic with another partition count is refused (``ValueError``): snapshots are
    addressed by partition number. The replication factor defaults to the settings'.
    """
    admin = admin_client(settings)
    metadata = admin.list_topics(timeout=_TIMEOUT_S)
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None:
        if len(existing.partitions) != partitions:
            raise ValueError(
                f"{topic} has {len(existing.partitions)} partitions, the source topic {partitions}: "
                "delete it (it is rebuilt from the next snapshots) or fix the plan"
            )
        return False
    if replication_factor is None:
        replication_factor = settings.replication_factor
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config={
            "cleanup.policy": ANOMALY_WINDOW_CHANGELOG.cleanup_policy,
            "max.message.bytes": str(SNAPSHOT_MAX_BYTES),
        },
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
    settings: Settings,
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
    restore: dict[str, Any] = {"enable.partition.eof": True, "fetch.message.max.bytes": SNAPSHOT_MAX_BYTES}
    conf = consumer_config(settings, RESTORE_GROUP, RESTORE_GROUP, **restore)
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
