"""DLQ store: every dead letter indexed in a local RocksDB, with status, audit trail and re-injection.

The store is a materialised view of two topics (filled by :mod:`app.ops.dlq.service`):
``topic.system.dlq`` (the raw key, value and headers of every dead letter) and
``topic.system.dlq.state`` (every operator change, :mod:`app.ops.dlq.state`). The next offset of
each is written in the same RocksDB batch as what it brought, so a restart resumes where it stopped
and a deleted directory is rebuilt by reading both topics from the beginning. Operator actions are
committed through a :class:`app.ops.dlq.journal.Journal` and shown only once applied, so every ops
replica serves the same view. Where it lives and what else the ops group keeps: :mod:`tables.ops`.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from rocksdict import Options, Rdict, WriteBatch

from app.ops.dlq.entries import (
    STATUSES,
    AuditEntry,
    DiscardRefused,
    DlqEntry,
    DlqError,
    DlqNotFound,
    ReinjectRefused,
)
from app.ops.dlq.filters import BulkResult, DlqFilter
from app.ops.dlq.journal import Journal, LocalJournal
from app.ops.dlq.reinject import HEADER_REINJECTED_COUNT, MAX_REINJECTIONS, Sender, reinject_headers
from app.ops.dlq.state import Claim, EntryState, EventState, StateChange, apply_change, claim_active
from app.platform.errors import SchemaViolation
from app.platform.faust.runtime import now_ms as clock_ms
from app.platform.metrics import DLQ_ACTIONS, DLQ_STORED
from schemas.system import FailureMetadata

__all__ = ["DlqStore"]

log = logging.getLogger(__name__)

_ENTRY = b"m:"
_OFFSET = b"o:"
_EVENT = b"r:"
_STATE = b"s:"
_STATE_OFFSET = b"q:"
#: How many change outcomes are remembered for :meth:`DlqStore.outcome`.
_OUTCOMES_KEPT = 4096


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

    ``sender`` (a core-profile producer) is needed only by :meth:`reinject`; ``journal`` is where
    operator changes are committed (the shared state topic in an ops worker; applied locally when
    none is given).
    """

    def __init__(
        self,
        path: Path,
        *,
        sender: Sender | None = None,
        journal: Journal | None = None,
        max_reinjections: int = MAX_REINJECTIONS,
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(str(self.path), options)
        self.sender = sender
        self.journal: Journal = journal or LocalJournal(self)
        self.max_reinjections = max_reinjections
        self._lock = asyncio.Lock()
        self._outcomes: OrderedDict[str, bool] = OrderedDict()
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
    def _with_state(self, entry: DlqEntry) -> DlqEntry:
        raw = self._db.get(_STATE + entry.dlq_id.encode())
        if raw is None:
            return entry
        state = EntryState.from_dict(orjson.loads(_raw(raw)))
        entry.status, entry.reinjected_count = state.status, state.reinjected_count
        entry.audit = list(state.audit)
        return entry

    def _entries(self) -> Iterator[DlqEntry]:
        for key, value in self._db.items(from_key=_ENTRY):
            if not _raw(key).startswith(_ENTRY):
                break
            yield self._with_state(DlqEntry.from_record(_raw(value)))

    def get(self, dlq_id: str) -> DlqEntry:
        """The dead letter ``dlq_id``; :class:`DlqNotFound` if there is none."""
        raw = self._db.get(_ENTRY + dlq_id.encode())
        if raw is None:
            raise DlqNotFound(f"no dead letter {dlq_id!r}")
        return self._with_state(DlqEntry.from_record(_raw(raw)))

    def entry_state(self, dlq_id: str) -> EntryState:
        """Operator state of ``dlq_id`` (``new``, no audit, when no change was applied)."""
        raw = self._db.get(_STATE + dlq_id.encode())
        return EntryState() if raw is None else EntryState.from_dict(orjson.loads(_raw(raw)))

    def event_state(self, event_key: str) -> EventState:
        """Version, re-injections and open claim of ``event_key`` (see :mod:`app.ops.dlq.state`)."""
        raw = self._db.get(_EVENT + event_key.encode())
        return EventState() if raw is None else EventState.from_dict(orjson.loads(_raw(raw)))

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

    def _offsets(self, prefix: bytes) -> dict[int, int]:
        offsets: dict[int, int] = {}
        for key, value in self._db.items(from_key=prefix):
            key = _raw(key)
            if not key.startswith(prefix):
                break
            offsets[int(key[len(prefix) :])] = int(_raw(value))
        return offsets

    def next_offsets(self) -> dict[int, int]:
        """Per DLQ partition, the next offset to index."""
        return self._offsets(_OFFSET)

    def state_offsets(self) -> dict[int, int]:
        """Per state-topic partition, the next offset to apply."""
        return self._offsets(_STATE_OFFSET)

    def outcome(self, change_id: str) -> bool | None:
        """Whether a recently applied change was accepted (``None``: not seen by this process)."""
        return self._outcomes.get(change_id)

    def reinjections_of(self, entry: DlqEntry) -> int:
        """How often this event was already re-injected for its group (over every DLQ generation)."""
        counted = self.event_state(entry.event_key()).reinjections
        from_header = entry.metadata.reinjected_count if entry.metadata else 0
        plain = entry.header(HEADER_REINJECTED_COUNT)
        header_count = int(plain) if plain is not None and plain.isdigit() else 0
        return max(entry.reinjected_count, counted, from_header, header_count)

    # -- indexing and applying -----------------------------------------------------------------
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
                return self._with_state(old), False
            # Same position, different record: the DLQ topic was recreated (e.g. a wiped broker).
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
        entry = self._with_state(entry)  # the state topic may have been read first (rebuild)
        self._counts[entry.status] += 1
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

    def apply(self, change: StateChange, position: tuple[int, int] | None = None) -> bool:
        """Apply one change in log order (``position``: its state-topic partition and offset, stored
        in the same batch); True if accepted, False if refused by the version check."""
        after = apply_change(self.event_state(change.event_key), change)
        batch = WriteBatch(raw_mode=True)
        if position is not None:
            batch.put(_STATE_OFFSET + str(position[0]).encode(), str(position[1] + 1).encode())
        old_status = self.entry_state(change.dlq_id).status
        if after is not None:
            batch.put(_EVENT + change.event_key.encode(), orjson.dumps(after.as_dict()))
            batch.put(_STATE + change.dlq_id.encode(), orjson.dumps(change.entry.as_dict()))
        self._db.write(batch)
        self._outcomes[change.change_id] = after is not None
        while len(self._outcomes) > _OUTCOMES_KEPT:
            self._outcomes.popitem(last=False)
        indexed = self._db.get(_ENTRY + change.dlq_id.encode()) is not None
        if after is not None and old_status != change.entry.status and indexed:
            self._counts[old_status] -= 1
            self._counts[change.entry.status] += 1
            self._publish_counts()
        return after is not None

    def skip_state(self, partition: int, offset: int) -> None:
        """Move past an unreadable state record (logged by the caller)."""
        self._db.put(_STATE_OFFSET + str(partition).encode(), str(offset + 1).encode())

    def _publish_counts(self) -> None:
        for status, count in self._counts.items():
            DLQ_STORED.labels(status).set(count)

    # -- operator actions ----------------------------------------------------------------------
    async def _current(self, dlq_id: str) -> tuple[DlqEntry, EventState]:
        """``dlq_id`` and its event's state, after reading every change committed so far."""
        entry = self.get(dlq_id)
        await self.journal.sync(entry.event_key())
        entry = self.get(dlq_id)
        return entry, self.event_state(entry.event_key())

    async def _commit(
        self, entry: DlqEntry, event: EventState, state: EntryState, *, reinjections: int, claim: Claim | None
    ) -> None:
        change = StateChange(
            uuid.uuid4().hex, entry.event_key(), event.version, entry.dlq_id, state, reinjections, claim
        )
        if not await self.journal.commit(change):
            raise DlqError(
                f"{entry.dlq_id} was changed at the same time by another operator or ops replica; "
                "reload it and try again"
            )

    @staticmethod
    def _state_of(entry: DlqEntry) -> EntryState:
        return EntryState(entry.status, entry.reinjected_count, tuple(entry.audit))

    async def discard(self, dlq_id: str, operator: str, reason: str) -> DlqEntry:
        """Mark a ``new`` dead letter discarded, with who and why in the audit trail."""
        reason = reason.strip()
        if not reason:
            DLQ_ACTIONS.labels("discard", "refused").inc()
            raise DiscardRefused("a reason is required to discard a dead letter")
        async with self._lock:
            entry, event = await self._current(dlq_id)
            if entry.status != "new" or claim_active(event.claim, clock_ms()):
                DLQ_ACTIONS.labels("discard", "refused").inc()
                why = "being re-injected" if entry.status == "new" else entry.status
                raise DiscardRefused(f"{dlq_id} is {why}; only new dead letters can be discarded")
            state = self._state_of(entry).with_audit(
                AuditEntry(clock_ms(), operator, "discard", reason), status="discarded"
            )
            await self._commit(entry, event, state, reinjections=event.reinjections, claim=event.claim)
        DLQ_ACTIONS.labels("discard", "ok").inc()
        log.info("dlq discarded dlq_id=%s by=%s reason=%s", dlq_id, operator, reason)
        return self.get(dlq_id)

    async def reinject(self, dlq_id: str, operator: str, *, reason: str | None = None) -> DlqEntry:
        """Produce the message again to its original topic (same key and value) and mark it.

        Refused (:class:`ReinjectRefused`) without usable failure metadata, while another
        re-injection of the event is in progress, or once the event was re-injected
        :attr:`max_reinjections` times for its group. The event is claimed in the shared state
        first, so of two replicas re-injecting at once only one produces; a failed produce is
        audited and raised as :class:`DlqError`, the status staying as it was.
        """
        if self.sender is None:
            raise DlqError("this DLQ store has no producer; re-inject through the ops worker")
        async with self._lock:
            entry, event = await self._current(dlq_id)
            meta = entry.metadata
            if meta is None:
                DLQ_ACTIONS.labels("reinject", "refused").inc()
                raise ReinjectRefused(
                    f"{dlq_id}: failure metadata unusable ({entry.metadata_error}); original topic unknown"
                )
            now = clock_ms()
            if claim_active(event.claim, now):
                DLQ_ACTIONS.labels("reinject", "refused").inc()
                assert event.claim is not None
                raise ReinjectRefused(
                    f"{dlq_id}: event {entry.event_id or '(no event id)'} is being re-injected by "
                    f"{event.claim.who} ({event.claim.dlq_id}); try again in a moment"
                )
            prior = self.reinjections_of(entry)
            if prior >= self.max_reinjections:
                DLQ_ACTIONS.labels("reinject", "refused").inc()
                raise ReinjectRefused(
                    f"{dlq_id}: event {entry.event_id or '(no event id)'} was already re-injected "
                    f"{prior} times for group {entry.consumer_group} (limit {self.max_reinjections}); "
                    "fix the cause and replay it by other means, or discard it"
                )
            state = self._state_of(entry)
            claim = Claim(uuid.uuid4().hex, dlq_id, operator, now)
            await self._commit(entry, event, state, reinjections=event.reinjections, claim=claim)
            claimed = self.event_state(entry.event_key())
            count = prior + 1
            headers = reinject_headers(entry.headers, operator, now, count)
            partition = None if entry.key is not None else meta.original_partition
            try:
                delivery = await self.sender.send(
                    meta.original_topic, entry.value, entry.key, headers, partition
                )
            except Exception as exc:  # audited and re-raised with context
                line = AuditEntry(now, operator, "reinject_failed", reason, str(exc)[:500])
                failed = state.with_audit(line)
                await self._commit(entry, claimed, failed, reinjections=event.reinjections, claim=None)
                DLQ_ACTIONS.labels("reinject", "failed").inc()
                raise DlqError(f"re-injecting {dlq_id} into {meta.original_topic} failed: {exc}") from exc
            detail = f"{delivery.topic}[{delivery.partition}]@{delivery.offset} (re-injection {count})"
            done = state.with_audit(
                AuditEntry(now, operator, "reinject", reason, detail),
                status="reinjected",
                reinjected_count=state.reinjected_count + 1,
            )
            await self._commit(entry, claimed, done, reinjections=count, claim=None)
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
        return self.get(dlq_id)

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
