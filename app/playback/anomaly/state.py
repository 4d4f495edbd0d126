"""The anomaly group's state backend: snapshots in a local RocksDB store, compacted changelogs,
their restore on assignment (what backs it, and why: :mod:`tables.anomaly`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, Protocol, TypeVar

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
from rocksdict import Rdict

from app.platform.errors import DependencyUnavailable
from app.platform.kafka.clients import consumer_config
from app.platform.settings import Settings
from app.platform.topics import ANOMALY_MERGE_CHANGELOG, ANOMALY_SNAPSHOT_MAX_BYTES, ANOMALY_WINDOW_CHANGELOG
from app.playback.anomaly.windows import SNAPSHOT_VERSION, PartitionState

__all__ = [
    "CHANGELOG_TOPIC",
    "MERGE_CHANGELOG_TOPIC",
    "RESTORE_GROUP",
    "SNAPSHOT_MAX_BYTES",
    "SNAPSHOT_VERSION",
    "PartitionState",
    "StateTopic",
    "WindowStore",
    "read_changelog",
    "restore_states",
    "window_store_dir",
]

log = logging.getLogger(__name__)

#: Compacted topic of window snapshots; one partition per source partition.
CHANGELOG_TOPIC: Final = ANOMALY_WINDOW_CHANGELOG.name
#: Compacted topic of stage-2 snapshots; one partition per partials partition.
MERGE_CHANGELOG_TOPIC: Final = ANOMALY_MERGE_CHANGELOG.name
#: Snapshots can be big (open windows of a busy partition): the topics allow records this large.
SNAPSHOT_MAX_BYTES: Final = ANOMALY_SNAPSHOT_MAX_BYTES
#: Consumer group id of the changelog reads on restore (assign only: it never joins or commits).
RESTORE_GROUP: Final = "avcc-anomaly-restore"
_TIMEOUT_S: Final = 30.0


class _Snapshotted(Protocol):
    """A detector state: restored from a snapshot that records its next offset."""

    offset: int | None


_S = TypeVar("_S", bound=_Snapshotted)


@dataclass(frozen=True, slots=True)
class StateTopic(Generic[_S]):
    """A consumed topic whose partitions each have a detector state: where it is snapshotted."""

    #: The consumed topic (its committed offsets tell whether a local snapshot is current).
    topic: str
    #: The compacted changelog of the states (partition = the consumed partition).
    changelog: str
    #: Key prefix in the :class:`WindowStore`.
    kind: str
    parse: Callable[[bytes], _S]
    fresh: Callable[[int], _S]


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
    """Local RocksDB copy of the latest snapshot of each partition (a cache of the changelogs).

    ``kind`` tells the stages apart: ``"p"`` source partitions (stage 1), ``"m"`` partials
    partitions (stage 2).
    """

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = Rdict(str(path))

    def get(self, partition: int, kind: str = "p") -> bytes | None:
        """The stored snapshot of ``partition``."""
        value = self._db.get(f"{kind}:{partition}")
        return bytes(value) if value is not None else None

    def put(self, partition: int, snapshot: bytes, kind: str = "p") -> None:
        """Store the snapshot of ``partition``."""
        self._db[f"{kind}:{partition}"] = snapshot

    def close(self) -> None:
        """Flush and release the database lock."""
        self._db.flush()
        self._db.close()


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


def restore_states(
    settings: Settings,
    store: WindowStore,
    consumer: Consumer,
    states: StateTopic[_S],
    partitions: list[int],
) -> dict[int, _S]:
    """The state of each of ``partitions``: the local snapshot if current, else the changelog's.

    A local snapshot is current when its offset is at least the group's committed offset of the
    partition; otherwise the changelog's last record wins when it is at least as far. Partitions
    without any snapshot get a fresh state.
    """
    topic, parse = states.topic, states.parse
    if not partitions:
        return {}
    committed = {
        tp.partition: tp.offset
        for tp in consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
    }
    restored: dict[int, _S] = {}
    need_changelog: list[int] = []
    for partition in partitions:
        raw = store.get(partition, states.kind)
        state = parse(raw) if raw else None
        floor = committed.get(partition, OFFSET_INVALID)
        if state is not None and state.offset is not None and (floor < 0 or state.offset >= floor):
            restored[partition] = state
            continue
        need_changelog.append(partition)
        if state is not None:
            restored[partition] = state
    if need_changelog:
        for partition, raw in read_changelog(settings, need_changelog, topic=states.changelog).items():
            remote = parse(raw)
            local = restored.get(partition)
            if local is None or (remote.offset or 0) >= (local.offset or 0):
                restored[partition] = remote
    sources = {p: ("local" if p not in need_changelog else "changelog") for p in restored}
    log.info(
        "anomaly: restored %d of %d partitions of %s (%s)", len(restored), len(partitions), topic, sources
    )
    for partition in partitions:
        if partition not in restored:
            restored[partition] = states.fresh(partition)
    return restored
