"""DLQ store: every dead letter indexed in a local RocksDB, with status, audit trail and re-injection.

The ops group runs :class:`DlqService`: a confluent-kafka consumer that reads every partition of
``topic.system.dlq`` (manual assignment, no group rebalancing) and indexes each message in a
:class:`DlqStore` under ``<data dir>/dlq``. The store is a materialised view of the DLQ topic: the
raw key, value and headers are kept, the next offset to read is written in the same RocksDB batch
as the message, so a restart resumes where it stopped and never indexes a message twice.

A message's ``dlq_id`` is ``{partition}-{offset}`` of the DLQ record. Its status is ``new`` until an
operator re-injects it into its original topic (``reinjected``: same key, same value, so the same
event id, and the original headers without the failure metadata plus ``avcc-reinjected-by/-at/
-count``) or discards it with a reason (``discarded``). Every action lands in the audit trail.
Re-injecting the same event for the same group more than :data:`MAX_REINJECTIONS` times is refused.

New arrivals increment ``avcc_dlq_indexed_total``, log one structured line and raise the P2 alert
``AvccDeadLetter`` through :mod:`app.ops.alerts` (de-duplicated per group and error class).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import hashlib
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol, get_args

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from mode import Service
from rocksdict import Options, Rdict, WriteBatch

from app.ops.alerts import AlertDispatcher, dead_letter_alert, dispatcher_from_settings
from app.platform.errors import AvccError, SchemaViolation
from app.platform.kafka.producers import Delivery, EventProducer, Headers
from app.platform.metrics import DLQ_ACTIONS, DLQ_INDEXED, DLQ_STORED
from app.platform.settings import Settings, get_settings
from app.platform.topics import DLQ
from schemas.system import HEADER_PREFIX, FailureMetadata, header_name

__all__ = [
    "HEADER_REINJECTED_AT",
    "HEADER_REINJECTED_BY",
    "HEADER_REINJECTED_COUNT",
    "MAX_REINJECTIONS",
    "STATUSES",
    "AuditEntry",
    "BulkResult",
    "DiscardRefused",
    "DlqEntry",
    "DlqError",
    "DlqFilter",
    "DlqNotFound",
    "DlqService",
    "DlqStore",
    "ReinjectRefused",
    "Sender",
    "Status",
    "install_dlq",
    "iso_ms",
    "reinject_headers",
]

log = logging.getLogger(__name__)

Status = Literal["new", "reinjected", "discarded"]
STATUSES: Final[tuple[Status, ...]] = get_args(Status)
#: Re-injections of one event (per consumer group) beyond this are refused.
MAX_REINJECTIONS: Final = 3

HEADER_REINJECTED_BY: Final = "avcc-reinjected-by"
HEADER_REINJECTED_AT: Final = "avcc-reinjected-at"
#: Same header as ``FailureMetadata.reinjected_count``.
HEADER_REINJECTED_COUNT: Final = header_name("reinjected_count")

_ENTRY = b"m:"
_OFFSET = b"o:"
_REINJECTIONS = b"r:"


class DlqError(AvccError):
    """A DLQ operation failed; the message says why and what to do."""


class DlqNotFound(DlqError, KeyError):
    """No dead letter has this id. List them with ``avcc dlq list``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"


class ReinjectRefused(DlqError):
    """Re-injection refused (cap reached, unknown original topic). Fix the cause, or discard it."""


class DiscardRefused(DlqError):
    """Discard refused (only ``new`` messages can be discarded, and a reason is required)."""


class Sender(Protocol):
    """What re-injection needs from a producer (:class:`app.platform.kafka.producers.EventProducer` fits)."""

    async def send(
        self,
        topic: Any,
        value: bytes,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> Delivery: ...


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso_ms(epoch_ms: int | None) -> str:
    """``2026-06-02T10:30:00.000Z`` for an epoch-ms value ("" for ``None`` / negative)."""
    if epoch_ms is None or epoch_ms < 0:
        return ""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _text(data: bytes | None) -> str | None:
    """UTF-8 text of ``data``, ``None`` when it is not valid UTF-8."""
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One line of a dead letter's audit trail."""

    at_ms: int
    who: str
    action: str
    reason: str | None = None
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (with an ISO timestamp)."""
        return {
            "at_ms": self.at_ms,
            "at": iso_ms(self.at_ms),
            "who": self.who,
            "action": self.action,
            "reason": self.reason,
            "detail": self.detail,
        }


@dataclass(slots=True)
class DlqEntry:
    """One dead letter: the raw DLQ record, its parsed failure metadata, status and audit trail."""

    dlq_id: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    received_ms: int
    status: Status = "new"
    reinjected_count: int = 0
    audit: list[AuditEntry] = field(default_factory=list)
    metadata: FailureMetadata | None = None
    metadata_error: str | None = None

    # -- derived fields ------------------------------------------------------------------------
    @property
    def original_topic(self) -> str:
        """Topic the message failed on ("" when the metadata is unusable)."""
        return self.metadata.original_topic if self.metadata else ""

    @property
    def consumer_group(self) -> str:
        """Group whose handler failed ("" when unknown)."""
        return self.metadata.consumer_group if self.metadata else ""

    @property
    def error_class(self) -> str:
        """Qualified exception class, e.g. ``schemas.errors.SchemaViolation``."""
        return self.metadata.error_class if self.metadata else "unknown"

    @property
    def event_id(self) -> str | None:
        """Envelope event id (``None`` for undecodable messages)."""
        return self.metadata.event_id if self.metadata else None

    @property
    def failed_at_ms(self) -> int:
        """When the message was dead-lettered (last failure, else the DLQ record time)."""
        return self.metadata.last_failure_ms if self.metadata else self.timestamp_ms

    def header(self, name: str) -> bytes | None:
        """Value of header ``name`` (the last one wins)."""
        found: bytes | None = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found

    def event_key(self) -> str:
        """What identifies "the same message" across DLQ generations: group + event id (or value hash)."""
        ident = self.event_id or "sha256:" + hashlib.sha256(self.value).hexdigest()[:32]
        return f"{self.consumer_group}|{ident}"

    # -- storage -------------------------------------------------------------------------------
    def to_record(self) -> bytes:
        """Storage form (raw bytes as base64)."""
        return orjson.dumps(
            {
                "dlq_id": self.dlq_id,
                "partition": self.partition,
                "offset": self.offset,
                "timestamp_ms": self.timestamp_ms,
                "key": _b64(self.key),
                "value": _b64(self.value),
                "headers": [[k, _b64(v)] for k, v in self.headers],
                "received_ms": self.received_ms,
                "status": self.status,
                "reinjected_count": self.reinjected_count,
                "audit": [a.as_dict() for a in self.audit],
                "metadata": self.metadata.model_dump(mode="json") if self.metadata else None,
                "metadata_error": self.metadata_error,
            }
        )

    @classmethod
    def from_record(cls, raw: bytes) -> DlqEntry:
        """Inverse of :meth:`to_record` (metadata was validated when indexed)."""
        data = orjson.loads(raw)
        meta = data.get("metadata")
        return cls(
            dlq_id=data["dlq_id"],
            partition=data["partition"],
            offset=data["offset"],
            timestamp_ms=data["timestamp_ms"],
            key=_unb64(data["key"]),
            value=_unb64(data["value"]) or b"",
            headers=[(k, _unb64(v) or b"") for k, v in data["headers"]],
            received_ms=data["received_ms"],
            status=data["status"],
            reinjected_count=data["reinjected_count"],
            audit=[
                AuditEntry(a["at_ms"], a["who"], a["action"], a.get("reason"), a.get("detail"))
                for a in data["audit"]
            ],
            metadata=FailureMetadata.model_construct(**meta) if meta else None,
            metadata_error=data.get("metadata_error"),
        )

    # -- API views -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The list-view fields (JSON-ready)."""
        meta = self.metadata
        return {
            "dlq_id": self.dlq_id,
            "status": self.status,
            "original_topic": self.original_topic,
            "original_partition": meta.original_partition if meta else None,
            "original_offset": meta.original_offset if meta else None,
            "consumer_group": self.consumer_group,
            "error_class": self.error_class,
            "error_message": (meta.error_message if meta else self.metadata_error or "")[:300],
            "event_id": self.event_id,
            "key": _text(self.key) if self.key is not None else None,
            "attempt": meta.attempt if meta else None,
            "failed_at_ms": self.failed_at_ms,
            "failed_at": iso_ms(self.failed_at_ms),
            "reinjected_count": self.reinjected_count,
            "dlq_partition": self.partition,
            "dlq_offset": self.offset,
        }

    def payload_text(self) -> tuple[str, str]:
        """``(kind, text)``: ``json`` pretty-printed, ``text`` (UTF-8, not JSON) or ``base64``."""
        try:
            parsed = orjson.loads(self.value)
        except orjson.JSONDecodeError:
            text = _text(self.value)
            if text is not None:
                return "text", text
            return "base64", base64.b64encode(self.value).decode()
        return "json", orjson.dumps(parsed, option=orjson.OPT_INDENT_2).decode()

    def detail(self) -> dict[str, Any]:
        """Everything: summary, headers, key and payload, metadata, stack trace, audit trail."""
        kind, text = self.payload_text()
        return {
            **self.summary(),
            "key_b64": _b64(self.key),
            "headers": [{"name": k, "value": _text(v), "value_b64": _b64(v)} for k, v in self.headers],
            "payload_kind": kind,
            "payload": text,
            "value_b64": _b64(self.value),
            "metadata": self.metadata.model_dump(mode="json", exclude={"stacktrace"})
            if self.metadata
            else None,
            "metadata_error": self.metadata_error,
            "stacktrace": self.metadata.stacktrace if self.metadata else None,
            "received_ms": self.received_ms,
            "dlq_timestamp_ms": self.timestamp_ms,
            "audit": [a.as_dict() for a in self.audit],
        }


def _short_class(name: str) -> str:
    return name.rsplit(".", 1)[-1]


@dataclass(frozen=True, slots=True)
class DlqFilter:
    """List filters; ``None`` matches everything. ``error_class`` also matches the short class name."""

    topic: str | None = None
    group: str | None = None
    error_class: str | None = None
    status: Status | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def matches(self, entry: DlqEntry) -> bool:
        """Whether ``entry`` passes every filter."""
        if self.topic and entry.original_topic != self.topic:
            return False
        if self.group and entry.consumer_group != self.group:
            return False
        if self.error_class and self.error_class not in {entry.error_class, _short_class(entry.error_class)}:
            return False
        if self.status and entry.status != self.status:
            return False
        if self.since_ms is not None and entry.failed_at_ms < self.since_ms:
            return False
        return not (self.until_ms is not None and entry.failed_at_ms > self.until_ms)

    def as_dict(self) -> dict[str, Any]:
        """Only the filters that are set."""
        raw = {
            "topic": self.topic,
            "group": self.group,
            "error_class": self.error_class,
            "status": self.status,
            "since_ms": self.since_ms,
            "until_ms": self.until_ms,
        }
        return {k: v for k, v in raw.items() if v not in (None, "")}

    @classmethod
    def from_mapping(cls, data: Any) -> DlqFilter:
        """From query parameters / a JSON object; raises ``ValueError`` on a bad value."""

        def text(name: str) -> str | None:
            value = data.get(name)
            if value is None:
                return None
            value = str(value).strip()
            return value or None

        def millis(name: str) -> int | None:
            value = text(name)
            if value is None:
                return None
            if value.lstrip("-").isdigit():
                return int(value)
            try:
                moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError as exc:
                raise ValueError(f"{name}: not epoch ms nor an ISO 8601 time: {value[:64]!r}") from exc
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            return int(moment.timestamp() * 1000)

        status = text("status")
        if status is not None and status not in STATUSES:
            raise ValueError(f"status: must be one of {', '.join(STATUSES)}")
        return cls(
            topic=text("topic"),
            group=text("group"),
            error_class=text("error_class"),
            status=status,
            since_ms=millis("since") if text("since") is not None else millis("since_ms"),
            until_ms=millis("until") if text("until") is not None else millis("until_ms"),
        )


@dataclass(slots=True)
class BulkResult:
    """Outcome of a bulk re-injection."""

    reinjected: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"reinjected": self.reinjected, "refused": self.refused}


def reinject_headers(
    headers: Iterable[tuple[str, bytes]], operator: str, at_ms: int, count: int
) -> list[tuple[str, bytes]]:
    """The original headers without any ``avcc-*`` failure/routing header, plus who/when/how often."""
    kept = [(k, v) for k, v in headers if not k.startswith(HEADER_PREFIX)]
    return [
        *kept,
        (HEADER_REINJECTED_BY, operator.encode()),
        (HEADER_REINJECTED_AT, str(at_ms).encode()),
        (HEADER_REINJECTED_COUNT, str(count).encode()),
    ]


def _raw(value: Any) -> bytes:
    """rocksdict (raw mode) hands back ``bytes``; its stubs say any value type."""
    if isinstance(value, bytes):
        return value
    raise TypeError(f"unexpected value {type(value).__name__} in the DLQ store")


def _parse_metadata(headers: Sequence[tuple[str, bytes]]) -> tuple[FailureMetadata | None, str | None]:
    try:
        return FailureMetadata.from_headers(headers), None
    except SchemaViolation as exc:
        return None, str(exc)


class DlqStore:
    """Persistent index of dead letters (RocksDB via rocksdict; one process at a time).

    ``sender`` (a core-profile producer) is needed only by :meth:`reinject`.
    """

    def __init__(
        self, path: Path, *, sender: Sender | None = None, max_reinjections: int = MAX_REINJECTIONS
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(str(self.path), options)
        self.sender = sender
        self.max_reinjections = max_reinjections
        self._lock = asyncio.Lock()
        self._counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for entry in self._entries():
            self._counts[entry.status] = self._counts.get(entry.status, 0) + 1
        self._publish_counts()

    def close(self) -> None:
        """Flush and close the database."""
        self._db.close()

    def __enter__(self) -> DlqStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------------
    def _entries(self) -> Iterator[DlqEntry]:
        for key, value in self._db.items(from_key=_ENTRY):
            if not _raw(key).startswith(_ENTRY):
                break
            yield DlqEntry.from_record(_raw(value))

    def get(self, dlq_id: str) -> DlqEntry:
        """The dead letter ``dlq_id``; :class:`DlqNotFound` if there is none."""
        raw = self._db.get(_ENTRY + dlq_id.encode())
        if raw is None:
            raise DlqNotFound(f"no dead letter {dlq_id!r}")
        return DlqEntry.from_record(_raw(raw))

    def list(self, filters: DlqFilter | None = None, *, limit: int | None = None) -> builtins.list[DlqEntry]:
        """Dead letters matching ``filters``, most recently failed first."""
        wanted = filters or DlqFilter()
        found = [e for e in self._entries() if wanted.matches(e)]
        found.sort(key=lambda e: (e.failed_at_ms, e.partition, e.offset), reverse=True)
        return found[:limit] if limit is not None else found

    def counts(self) -> dict[str, int]:
        """Number of dead letters per status."""
        return dict(self._counts)

    def facets(self) -> dict[str, builtins.list[str]]:
        """Distinct topics, groups and error classes (for the console's filter suggestions)."""
        topics: set[str] = set()
        groups: set[str] = set()
        errors: set[str] = set()
        for entry in self._entries():
            topics.add(entry.original_topic)
            groups.add(entry.consumer_group)
            errors.add(entry.error_class)
        return {
            "topic": sorted(t for t in topics if t),
            "group": sorted(g for g in groups if g),
            "error_class": sorted(errors),
        }

    def next_offsets(self) -> dict[int, int]:
        """Per DLQ partition, the next offset to index."""
        offsets: dict[int, int] = {}
        for key, value in self._db.items(from_key=_OFFSET):
            key = _raw(key)
            if not key.startswith(_OFFSET):
                break
            offsets[int(key[len(_OFFSET) :])] = int(_raw(value))
        return offsets

    def reinjections_of(self, entry: DlqEntry) -> int:
        """How often this event was already re-injected for its group (over every DLQ generation)."""
        raw = self._db.get(_REINJECTIONS + entry.event_key().encode())
        counted = int(_raw(raw)) if raw is not None else 0
        from_header = entry.metadata.reinjected_count if entry.metadata else 0
        plain = entry.header(HEADER_REINJECTED_COUNT)
        header_count = int(plain) if plain is not None and plain.isdigit() else 0
        return max(entry.reinjected_count, counted, from_header, header_count)

    # -- writing -------------------------------------------------------------------------------
    def index(
        self,
        partition: int,
        offset: int,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] | None,
        *,
        now_ms: int | None = None,
    ) -> tuple[DlqEntry, bool]:
        """Index one DLQ record; returns ``(entry, is_new)``. Idempotent per (partition, offset)."""
        plain = [(k, bytes(v or b"")) for k, v in (headers or [])]
        raw_value = bytes(value or b"")
        dlq_id = f"{partition}-{offset}"
        existing = self._db.get(_ENTRY + dlq_id.encode())
        if existing is not None:
            old = DlqEntry.from_record(_raw(existing))
            if old.value == raw_value and old.headers == plain and old.key == key:
                self._store_offset(partition, offset)
                return old, False
            # Same position, different record: the DLQ topic was recreated (e.g. Tansu memory).
            dlq_id = self._free_id(dlq_id)
            log.warning(
                "DLQ %d-%d holds a different record than indexed; storing as %s", partition, offset, dlq_id
            )
        metadata, error = _parse_metadata(plain)
        entry = DlqEntry(
            dlq_id=dlq_id,
            partition=partition,
            offset=offset,
            timestamp_ms=timestamp_ms,
            key=key,
            value=raw_value,
            headers=plain,
            received_ms=now_ms if now_ms is not None else _now_ms(),
            metadata=metadata,
            metadata_error=error,
        )
        batch = WriteBatch(raw_mode=True)
        batch.put(_ENTRY + dlq_id.encode(), entry.to_record())
        batch.put(_OFFSET + str(partition).encode(), str(offset + 1).encode())
        self._db.write(batch)
        self._counts["new"] += 1
        self._publish_counts()
        return entry, True

    def _free_id(self, base: str) -> str:
        n = 1
        while self._db.get(_ENTRY + f"{base}-{n}".encode()) is not None:
            n += 1
        return f"{base}-{n}"

    def _store_offset(self, partition: int, offset: int) -> None:
        current = self.next_offsets().get(partition, 0)
        if offset + 1 > current:
            self._db.put(_OFFSET + str(partition).encode(), str(offset + 1).encode())

    def _save(self, entry: DlqEntry, *, old_status: Status, reinjections: int | None = None) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(_ENTRY + entry.dlq_id.encode(), entry.to_record())
        if reinjections is not None:
            batch.put(_REINJECTIONS + entry.event_key().encode(), str(reinjections).encode())
        self._db.write(batch)
        if old_status != entry.status:
            self._counts[old_status] -= 1
            self._counts[entry.status] += 1
            self._publish_counts()

    def _publish_counts(self) -> None:
        for status, count in self._counts.items():
            DLQ_STORED.labels(status).set(count)

    def discard(self, dlq_id: str, operator: str, reason: str) -> DlqEntry:
        """Mark a ``new`` dead letter discarded, with who and why in the audit trail."""
        reason = reason.strip()
        if not reason:
            DLQ_ACTIONS.labels("discard", "refused").inc()
            raise DiscardRefused("a reason is required to discard a dead letter")
        entry = self.get(dlq_id)
        if entry.status != "new":
            DLQ_ACTIONS.labels("discard", "refused").inc()
            raise DiscardRefused(f"{dlq_id} is {entry.status}; only new dead letters can be discarded")
        old = entry.status
        entry.status = "discarded"
        entry.audit.append(AuditEntry(_now_ms(), operator, "discard", reason))
        self._save(entry, old_status=old)
        DLQ_ACTIONS.labels("discard", "ok").inc()
        log.info("dlq discarded dlq_id=%s by=%s reason=%s", dlq_id, operator, reason)
        return entry

    async def reinject(self, dlq_id: str, operator: str, *, reason: str | None = None) -> DlqEntry:
        """Produce the message again to its original topic (same key and value) and mark it.

        Refused (:class:`ReinjectRefused`) without usable failure metadata or once the event was
        re-injected :attr:`max_reinjections` times for its group; a failed produce is audited and
        raised as :class:`DlqError`, the status staying as it was.
        """
        if self.sender is None:
            raise DlqError("this DLQ store has no producer; re-inject through the ops worker")
        async with self._lock:
            entry = self.get(dlq_id)
            meta = entry.metadata
            if meta is None:
                DLQ_ACTIONS.labels("reinject", "refused").inc()
                raise ReinjectRefused(
                    f"{dlq_id}: failure metadata unusable ({entry.metadata_error}); original topic unknown"
                )
            prior = self.reinjections_of(entry)
            if prior >= self.max_reinjections:
                DLQ_ACTIONS.labels("reinject", "refused").inc()
                raise ReinjectRefused(
                    f"{dlq_id}: event {entry.event_id or '(no event id)'} was already re-injected "
                    f"{prior} times for group {entry.consumer_group} (limit {self.max_reinjections}); "
                    "fix the cause and replay it by other means, or discard it"
                )
            now = _now_ms()
            count = prior + 1
            headers = reinject_headers(entry.headers, operator, now, count)
            partition = None if entry.key is not None else meta.original_partition
            try:
                delivery = await self.sender.send(
                    meta.original_topic, entry.value, entry.key, headers, partition
                )
            except Exception as exc:  # audited and re-raised with context
                entry.audit.append(AuditEntry(now, operator, "reinject_failed", reason, str(exc)[:500]))
                self._save(entry, old_status=entry.status)
                DLQ_ACTIONS.labels("reinject", "failed").inc()
                raise DlqError(f"re-injecting {dlq_id} into {meta.original_topic} failed: {exc}") from exc
            old = entry.status
            entry.status = "reinjected"
            entry.reinjected_count += 1
            entry.audit.append(
                AuditEntry(
                    now,
                    operator,
                    "reinject",
                    reason,
                    f"{delivery.topic}[{delivery.partition}]@{delivery.offset} (re-injection {count})",
                )
            )
            self._save(entry, old_status=old, reinjections=count)
        DLQ_ACTIONS.labels("reinject", "ok").inc()
        log.info(
            "dlq reinjected dlq_id=%s by=%s topic=%s partition=%d offset=%d event_id=%s count=%d",
            dlq_id,
            operator,
            delivery.topic,
            delivery.partition,
            delivery.offset,
            entry.event_id,
            count,
        )
        return entry

    async def bulk_reinject(
        self, filters: DlqFilter, operator: str, *, reason: str | None = None
    ) -> BulkResult:
        """Re-inject every match of ``filters`` (status defaults to ``new``), oldest first."""
        if filters.status is None:
            filters = DlqFilter(
                filters.topic, filters.group, filters.error_class, "new", filters.since_ms, filters.until_ms
            )
        result = BulkResult()
        for entry in reversed(self.list(filters)):
            try:
                await self.reinject(entry.dlq_id, operator, reason=reason)
            except DlqError as exc:
                result.refused[entry.dlq_id] = str(exc)
            else:
                result.reinjected.append(entry.dlq_id)
        return result


class DlqService(Service):
    """The ops group's DLQ indexer: reads every DLQ partition into a :class:`DlqStore`, alerts on
    new arrivals, and owns the core producer used for re-injection.

    Run one ops worker: the store is local to its process (see the module docstring).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        store_path: Path | None = None,
        topic: str = DLQ.name,
        group_id: str = "avcc-ops-dlq",
        dispatcher: AlertDispatcher | None = None,
        console_url: str | None = None,
        alert_max_age_s: float = 3600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.settings = settings or get_settings()
        self.store_path = store_path
        self.topic = topic
        self.group_id = group_id
        self.console_url = console_url
        self.alert_max_age_s = alert_max_age_s
        self._dispatcher = dispatcher
        self._store: DlqStore | None = None
        self._producer: EventProducer | None = None
        self._consumer: Consumer | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlq-consumer")
        self._assigned: set[int] = set()
        self._next_assign_check = 0.0
        self._pending: set[asyncio.Task[Any]] = set()
        self.indexed = 0

    @property
    def store(self) -> DlqStore:
        """The open store (:class:`DlqError` before the service started)."""
        if self._store is None:
            raise DlqError("the DLQ store is not open yet (ops worker starting)")
        return self._store

    @property
    def ready(self) -> bool:
        """True once the store is open and the producer exists."""
        return self._store is not None and self._store.sender is not None

    async def _call(self, fun: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fun, *args)

    def _make_producer(self) -> EventProducer:
        producer = EventProducer(self.settings, "core", client_id="avcc-ops-dlq")
        producer.verify_profile()
        return producer

    async def on_start(self) -> None:
        """Open the store, create the producer and the consumer."""
        path = self.store_path or self.settings.resolve_data_path("dlq")
        self._store = DlqStore(path)
        if self._dispatcher is None:
            self._dispatcher = dispatcher_from_settings(self.settings)
        self._consumer = Consumer(
            {
                **self.settings.kafka_client_config(),
                "group.id": self.group_id,
                "client.id": "avcc-ops-dlq",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
            }
        )
        loop = asyncio.get_running_loop()
        self._producer = await loop.run_in_executor(None, self._make_producer)
        self._store.sender = self._producer
        log.info("DLQ store open at %s (%s)", path, self._store.counts())

    @Service.task
    async def _consume(self) -> None:
        while not self.should_stop:
            try:
                await self._ensure_assignment()
                if not self._assigned:
                    await self.sleep(1.0)
                    continue
                assert self._consumer is not None
                messages = await self._call(self._consumer.consume, 200, 0.5)
                for message in messages:
                    await self._handle(message)
                if messages:
                    await self._commit()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep indexing after transient broker errors
                log.exception("DLQ consumer loop error: %r", exc)
                await self.sleep(1.0)

    async def _ensure_assignment(self) -> None:
        now = time.monotonic()
        if now < self._next_assign_check:
            return
        self._next_assign_check = now + 30.0
        assert self._consumer is not None
        meta = await self._call(self._consumer.list_topics, self.topic, 10.0)
        topic_meta = meta.topics.get(self.topic)
        if topic_meta is None or topic_meta.error is not None or not topic_meta.partitions:
            log.warning("DLQ topic %s not available yet; retrying", self.topic)
            self._next_assign_check = now + 2.0
            return
        partitions = set(topic_meta.partitions)
        if partitions == self._assigned:
            return
        offsets = self.store.next_offsets()
        assignment = [
            TopicPartition(self.topic, p, offsets.get(p, OFFSET_BEGINNING)) for p in sorted(partitions)
        ]
        await self._call(self._consumer.assign, assignment)
        self._assigned = partitions
        log.info("DLQ indexer reading %s partitions %s from %s", self.topic, sorted(partitions), offsets)

    async def _commit(self) -> None:
        """Mirror the store's positions into Kafka (group ``avcc-ops-dlq``) for lag monitoring."""
        consumer = self._consumer
        if consumer is None:
            return
        offsets = [TopicPartition(self.topic, p, o) for p, o in self.store.next_offsets().items()]
        if offsets:
            await self._call(lambda: consumer.commit(offsets=offsets, asynchronous=True))

    async def _handle(self, message: Any) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("DLQ consumer error: %s", error)
            return
        _, timestamp = message.timestamp()
        entry, new = self.store.index(
            message.partition(),
            message.offset(),
            int(timestamp or 0),
            message.key(),
            message.value(),
            message.headers(),
        )
        if not new:
            return
        self.indexed += 1
        DLQ_INDEXED.labels(entry.consumer_group, entry.original_topic, entry.error_class).inc()
        meta = entry.metadata
        log.error(
            "dlq.new dlq_id=%s group=%s topic=%s partition=%s offset=%s event_id=%s attempt=%s "
            "error_class=%s error=%s",
            entry.dlq_id,
            entry.consumer_group,
            entry.original_topic,
            meta.original_partition if meta else None,
            meta.original_offset if meta else None,
            entry.event_id,
            meta.attempt if meta else None,
            entry.error_class,
            (meta.error_message if meta else entry.metadata_error or "")[:300],
        )
        if _now_ms() - entry.failed_at_ms > self.alert_max_age_s * 1000:
            return  # re-indexing history (new store): no alert storm for old dead letters
        assert self._dispatcher is not None
        alert = dead_letter_alert(
            group=entry.consumer_group or "unknown",
            error_class=entry.error_class,
            topic=entry.original_topic or "unknown",
            dlq_id=entry.dlq_id,
            error_message=meta.error_message if meta else entry.metadata_error or "",
            event_id=entry.event_id,
            console_url=self.console_url,
        )
        task = asyncio.ensure_future(self._dispatcher.dispatch(alert))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def wait_indexed(self, count: int, timeout_s: float = 30.0) -> None:
        """Wait until at least ``count`` new messages were indexed (tests, tooling)."""
        deadline = time.monotonic() + timeout_s
        while self.indexed < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"indexed {self.indexed} of {count} dead letters")
            await asyncio.sleep(0.05)

    async def on_shutdown(self) -> None:
        """Close consumer (after the last poll), alert sinks, producer and store."""
        if self._pending:
            await asyncio.wait(self._pending, timeout=5.0)
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await self._call(consumer.close)
        self._pool.shutdown(wait=True)
        if self._dispatcher is not None:
            await self._dispatcher.close()
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await asyncio.get_running_loop().run_in_executor(None, producer.close)
        if self._store is not None:
            store, self._store = self._store, None
            store.close()


def install_dlq(app: Any, settings: Settings | None = None, **kwargs: Any) -> DlqService:
    """Create the :class:`DlqService` of ``app`` (once) and start it with the app's worker."""
    existing = getattr(app, "_avcc_dlq_service", None)
    if isinstance(existing, DlqService):
        return existing
    service = DlqService(settings or get_settings(), **kwargs)
    app.service(service)
    app._avcc_dlq_service = service
    return service
