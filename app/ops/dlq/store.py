"""DLQ store: every dead letter indexed in a local RocksDB, with status, audit trail and re-injection.

The store is a materialised view of ``topic.system.dlq`` (filled by :mod:`app.ops.dlq.service`):
the raw key, value and headers are kept, and the next offset to read is written in the same
RocksDB batch as the message, so a restart resumes where it stopped and never indexes a message
twice. Where it lives and what else the ops group keeps: :mod:`tables.ops`.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch

from app.ops.dlq.entries import (
    STATUSES,
    AuditEntry,
    DiscardRefused,
    DlqEntry,
    DlqError,
    DlqNotFound,
    ReinjectRefused,
    Status,
)
from app.ops.dlq.filters import BulkResult, DlqFilter
from app.ops.dlq.reinject import HEADER_REINJECTED_COUNT, MAX_REINJECTIONS, Sender, reinject_headers
from app.platform.errors import SchemaViolation
from app.platform.faust.runtime import now_ms as clock_ms
from app.platform.metrics import DLQ_ACTIONS, DLQ_STORED
from schemas.system import FailureMetadata

__all__ = ["DlqStore"]

log = logging.getLogger(__name__)

_ENTRY = b"m:"
_OFFSET = b"o:"
_REINJECTIONS = b"r:"


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
            received_ms=now_ms if now_ms is not None else clock_ms(),
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
        entry.audit.append(AuditEntry(clock_ms(), operator, "discard", reason))
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
            now = clock_ms()
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
