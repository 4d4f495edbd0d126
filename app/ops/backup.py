"""Backups of the pipeline's state topics, restored into an empty Kafka cluster
(``avcc backup export DIR`` and ``avcc backup import DIR``).

What a backup holds (:func:`backup_topics`): every table changelog of the agent groups (the code
group's records and claims, the review tasks, the chain submissions, the settlement clearing, …)
but the retry-parking tables, whose entries name messages of the retry path that a new cluster
does not have; the groups' other state topics (the operators' actions on dead letters); and the
dead letters themselves. Each partition's records are written in order, with their keys, values
(tombstones included), headers and timestamps, one gzipped JSON line per record, one file per
topic, beside a manifest of the partition counts and of the offsets read to.

A record id is derived from the offset of its claim request in the claims topic
(:func:`~app.lifecycle.code.claims.record_id_for`), so a restored cluster must never give a
claim request an offset below the ones it gave before. The manifest keeps the claims topic's end
offsets, and an import writes that many empty records to each claims partition (retention deletes
them after a day) and commits the code group's offsets past them: new applications get new ids,
and the claims agent reads none of the fill.

The import refuses a cluster whose topics already hold records: it restores into an empty one,
whose workers start on empty data dirs and rebuild their tables from the restored changelogs.
"""

from __future__ import annotations

import base64
import gzip
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from app.platform.errors import AvccError
from app.platform.faust.app import consumer_group_id
from app.platform.faust.tables import PARKED_SUFFIX
from app.platform.groups import GROUPS
from app.platform.internal_topics import changelog_specs, group_app
from app.platform.kafka.admin import apply_plan
from app.platform.kafka.clients import consumer_config, producer_config
from app.platform.settings import Settings
from app.platform.topics import CODE_CLAIMS, DLQ, TOPIC_PLAN, TopicSpec

__all__ = [
    "FORMAT",
    "BackupError",
    "Manifest",
    "TopicBackup",
    "backup_topics",
    "export_backup",
    "import_backup",
]

#: Version of the files' layout; an import refuses any other.
FORMAT: Final = 1
MANIFEST: Final = "manifest.json"
#: The consumer group whose claims-topic offsets the import sets past the fill.
CLAIMS_GROUP: Final = consumer_group_id("code")
#: Longest a read or a write may go without progress before the backup gives up.
_IDLE_S: Final = 60.0
_CHUNK: Final = 10_000
#: Answers about a partition whose leader is not settled yet.
_SETTLING: Final = frozenset(
    {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
)


class BackupError(AvccError):
    """A backup cannot be made or restored as asked; the message says why."""


@dataclass(slots=True)
class TopicBackup:
    """One topic of a backup: its layout and, per partition, the offsets read and records kept."""

    name: str
    partitions: int
    config: dict[str, str]
    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    records: dict[int, int] = field(default_factory=dict)

    @property
    def file(self) -> str:
        """The file its records are in, beside the manifest."""
        return f"{self.name}.ndjson.gz"

    @property
    def total(self) -> int:
        """Records kept, every partition."""
        return sum(self.records.values())


@dataclass(slots=True)
class Manifest:
    """What a backup directory holds."""

    created_ms: int
    topics: list[TopicBackup]
    #: End offset of each claims partition when the backup was made (the record-id space).
    claims_ends: dict[int, int]
    format: int = FORMAT

    def dumps(self) -> bytes:
        """The manifest as indented JSON."""
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """Read a manifest written by :meth:`dumps`."""
        raw = orjson.loads(path.read_bytes())
        if raw.get("format") != FORMAT:
            raise BackupError(f"{path}: backup format {raw.get('format')!r}, this version reads {FORMAT}")

        def ints(mapping: dict[str, int]) -> dict[int, int]:
            return {int(k): int(v) for k, v in mapping.items()}

        topics = [
            TopicBackup(
                t["name"], t["partitions"], t["config"], ints(t["start"]), ints(t["end"]), ints(t["records"])
            )
            for t in raw["topics"]
        ]
        return cls(raw["created_ms"], topics, ints(raw["claims_ends"]))


def backup_topics() -> list[TopicSpec]:
    """The topics a backup holds: the groups' table changelogs but retry parking, the groups'
    other state topics, and the dead letters."""
    parked = {
        table.changelog_topic.get_topic_name()
        for group in GROUPS
        for table in group_app(group).tables.values()
        if table.name.endswith(PARKED_SUFFIX)
    }
    return [*(spec for spec in changelog_specs() if spec.name not in parked), DLQ]


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _line(message: Message) -> bytes:
    headers = [[k, _b64(v)] for k, v in message.headers() or ()]
    record = {
        "p": message.partition(),
        "o": message.offset(),
        "t": message.timestamp()[1],
        "k": _b64(message.key()),
        "v": _b64(message.value()),
        "h": headers,
    }
    return orjson.dumps(record) + b"\n"


def _consumer(settings: Settings) -> Consumer:
    """A consumer that only reads assigned partitions (its group id is never used to commit)."""
    group = f"avcc-backup-{uuid.uuid4().hex[:12]}"
    eof: dict[str, Any] = {"enable.partition.eof": True}
    return Consumer(consumer_config(settings, group, "avcc-backup", **eof))


def _watermark(consumer: Consumer, partition: TopicPartition) -> tuple[int, int]:
    """A partition's low and high watermarks, asked again while its leader is not settled (a
    topic just created)."""
    deadline = time.monotonic() + _IDLE_S
    while True:
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=15, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            if not exc.args[0].retriable() and exc.args[0].code() not in _SETTLING:
                raise
            if time.monotonic() > deadline:
                raise BackupError(f"{partition.topic} [{partition.partition}]: {exc.args[0]}") from exc
            time.sleep(0.5)


def _watermarks(consumer: Consumer, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    return {p: _watermark(consumer, TopicPartition(topic, p)) for p in range(partitions)}


def _partition_count(consumer: Consumer, topic: str) -> int:
    found = consumer.list_topics(topic, timeout=15).topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise BackupError(f"topic {topic} does not exist on this cluster")
    return len(found.partitions)


def _export_topic(consumer: Consumer, spec: TopicSpec, out: Path) -> TopicBackup:
    """Write every record of ``spec`` below the end offsets it has now to ``out``."""
    partitions = _partition_count(consumer, spec.name)
    marks = _watermarks(consumer, spec.name, partitions)
    backup = TopicBackup(spec.name, partitions, spec.broker_config())
    backup.start = {p: low for p, (low, _) in marks.items()}
    backup.end = {p: high for p, (_, high) in marks.items()}
    backup.records = dict.fromkeys(range(partitions), 0)
    pending = {p for p, (low, high) in marks.items() if high > low}
    with gzip.open(out / backup.file, "wb", compresslevel=1) as sink:
        if pending:
            consumer.assign([TopicPartition(spec.name, p, marks[p][0]) for p in pending])
        last = time.monotonic()
        while pending:
            if time.monotonic() - last > _IDLE_S:
                left = sorted(pending)
                raise BackupError(f"{spec.name}: nothing read for {_IDLE_S:.0f} s, partitions {left} left")
            for message in consumer.consume(_CHUNK, timeout=1.0):
                last = time.monotonic()
                p, error = message.partition(), message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise BackupError(f"{spec.name}: {error}")
                if error is None and message.offset() < backup.end[p]:
                    sink.write(_line(message))
                    backup.records[p] += 1
                reached = message.offset() + (1 if error is None else 0)
                if p in pending and reached >= backup.end[p]:
                    pending.discard(p)
        consumer.unassign()
    return backup


def export_backup(
    settings: Settings,
    directory: Path,
    topics: Sequence[str] = (),
    progress: Callable[[TopicBackup], None] = lambda _: None,
) -> Manifest:
    """Write ``topics`` (default: :func:`backup_topics`) and the claims topic's end offsets to
    ``directory`` (created; it must hold no backup yet); ``progress`` hears of each topic done."""
    specs = backup_topics()
    if topics:
        unknown = set(topics) - {s.name for s in specs}
        if unknown:
            raise BackupError(f"not state topics of the pipeline: {', '.join(sorted(unknown))}")
        specs = [s for s in specs if s.name in topics]
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / MANIFEST).exists():
        raise BackupError(f"{directory} holds a backup already; export into a new directory")
    consumer = _consumer(settings)
    try:
        claims = _watermarks(consumer, CODE_CLAIMS.name, _partition_count(consumer, CODE_CLAIMS.name))
        manifest = Manifest(int(time.time() * 1000), [], {p: high for p, (_, high) in claims.items()})
        for spec in specs:
            manifest.topics.append(_export_topic(consumer, spec, directory))
            progress(manifest.topics[-1])
    finally:
        consumer.close()
    (directory / MANIFEST).write_bytes(manifest.dumps())
    return manifest


@dataclass(slots=True)
class ImportReport:
    """What an import wrote: records per topic, and the empty records put in each claims partition."""

    records: dict[str, int] = field(default_factory=dict)
    claims_fill: dict[int, int] = field(default_factory=dict)


def _records(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rb") as source:
        for line in source:
            yield orjson.loads(line)


class _Writer:
    """An idempotent producer (the core profile's) writing to explicit partitions, in order."""

    def __init__(self, settings: Settings) -> None:
        self.producer = Producer(producer_config(settings, "core", "avcc-backup", **{"linger.ms": 20}))
        self.failures: list[str] = []

    def _delivered(self, error: KafkaError | None, _: Message) -> None:
        if error is not None:
            self.failures.append(str(error))

    def send(self, topic: str, partition: int, record: dict[str, Any]) -> None:
        """Queue one record, waiting for room in the queue when it is full."""
        headers = [(k, _unb64(v)) for k, v in record.get("h", ())]
        while True:
            try:
                self.producer.produce(
                    topic,
                    value=_unb64(record.get("v")),
                    key=_unb64(record.get("k")),
                    partition=partition,
                    headers=headers or None,
                    timestamp=max(int(record.get("t") or 0), 0),
                    on_delivery=self._delivered,
                )
                return
            except BufferError:
                self.producer.poll(0.1)

    def finish(self) -> None:
        """Wait for every record to be acknowledged; raise if any was not."""
        left = self.producer.flush(_IDLE_S * 5)
        if left or self.failures:
            failed = len(self.failures)
            raise BackupError(f"{left} records unacknowledged, {failed} failed: {self.failures[:3]}")


def _require_empty(consumer: Consumer, manifest: Manifest) -> None:
    """Refuse a cluster whose restored topics hold records, or whose layout differs."""
    for topic in manifest.topics:
        partitions = _partition_count(consumer, topic.name)
        if partitions != topic.partitions:
            raise BackupError(f"{topic.name}: {partitions} partitions here, {topic.partitions} in the backup")
    for name in [*(t.name for t in manifest.topics), CODE_CLAIMS.name]:
        marks = _watermarks(consumer, name, _partition_count(consumer, name))
        if any(high > 0 for _, high in marks.values()):
            raise BackupError(f"{name} holds records already: restore into an empty cluster")


def _fill_claims(settings: Settings, writer: _Writer, ends: dict[int, int]) -> dict[int, int]:
    """Put the claims topic's partitions at their backed-up end offsets and commit the code
    group's offsets there."""
    fill = {p: end for p, end in ends.items() if end > 0}
    for partition, count in fill.items():
        for _ in range(count):
            writer.send(CODE_CLAIMS.name, partition, {})
    writer.finish()
    committer = Consumer(consumer_config(settings, CLAIMS_GROUP, "avcc-backup"))
    try:
        offsets = [TopicPartition(CODE_CLAIMS.name, p, end) for p, end in fill.items()]
        if offsets:
            committer.commit(offsets=offsets, asynchronous=False)
    finally:
        committer.close()
    return fill


def import_backup(
    settings: Settings, directory: Path, progress: Callable[[str, int], None] = lambda *_: None
) -> ImportReport:
    """Create the topic plan on an empty cluster, write every topic of the backup in
    ``directory`` back partition by partition, and restore the record-id space."""
    manifest = Manifest.load(directory / MANIFEST)
    drift = apply_plan(settings, [*TOPIC_PLAN, *changelog_specs()]).unfixed
    if drift:
        raise BackupError("the cluster's topics drift from the plan: " + "; ".join(d.line() for d in drift))
    consumer = _consumer(settings)
    report = ImportReport()
    try:
        _require_empty(consumer, manifest)
        writer = _Writer(settings)
        for topic in manifest.topics:
            for record in _records(directory / topic.file):
                writer.send(topic.name, int(record["p"]), record)
            writer.finish()
            marks = _watermarks(consumer, topic.name, topic.partitions)
            written = {p: high for p, (_, high) in marks.items()}
            if written != topic.records:
                raise BackupError(f"{topic.name}: wrote {written}, the backup holds {topic.records}")
            report.records[topic.name] = topic.total
            progress(topic.name, topic.total)
        report.claims_fill = _fill_claims(settings, writer, manifest.claims_ends)
    finally:
        consumer.close()
    return report
