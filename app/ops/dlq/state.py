"""Operator state of dead letters as a log of versioned changes: what one change says, how it applies.

Every operator action (discard, re-injection claim, re-injection, failed re-injection) is one
:class:`StateChange` produced to ``topic.system.dlq.state`` *before* the operator gets an answer.
A change is keyed by the dead letter's *event key* (consumer group + event id, see
:meth:`app.ops.dlq.entries.DlqEntry.event_key`), so every action on one dead letter - and on every
DLQ generation of the same event, which share one re-injection budget - lands in one partition and
is read by every ops replica in the same order.

A change carries the *full* new state of its entry (status, re-injection count, audit trail) and
of its event (re-injections, open claim), plus the event version it was computed from.
:func:`apply_change` accepts it only when that version is still the current one (compare and set
in log order): of two replicas acting on the same version, the first change in the log wins on
every replica and the second is refused everywhere, so all replicas fold the log to one view and
the losing replica tells its operator to reload. Pure functions only; storage is
:mod:`app.ops.dlq.store`, transport :mod:`app.ops.dlq.journal`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from app.ops.dlq.entries import AuditEntry, Status

__all__ = [
    "CLAIM_TTL_MS",
    "Claim",
    "EntryState",
    "EventState",
    "StateChange",
    "apply_change",
    "claim_active",
    "state_partition",
]

#: How long a re-injection claim blocks other actions on its event; a replica that died between
#: claiming and re-injecting leaves a claim that expires after this (then it may be re-injected again).
CLAIM_TTL_MS: Final = 300_000


@dataclass(frozen=True, slots=True)
class EntryState:
    """What operators changed on one dead letter: its status, re-injections and audit trail."""

    status: Status = "new"
    reinjected_count: int = 0
    audit: tuple[AuditEntry, ...] = ()

    def with_audit(self, line: AuditEntry, **changes: Any) -> EntryState:
        """This state with ``line`` appended to the audit trail and ``changes`` applied."""
        return replace(self, audit=(*self.audit, line), **changes)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "status": self.status,
            "reinjected_count": self.reinjected_count,
            "audit": [a.as_dict() for a in self.audit],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EntryState:
        """Inverse of :meth:`as_dict`."""
        audit = tuple(AuditEntry.from_dict(a) for a in data["audit"])
        return cls(data["status"], int(data["reinjected_count"]), audit)


@dataclass(frozen=True, slots=True)
class Claim:
    """A re-injection in progress: one replica owns the event until it records the outcome."""

    token: str
    dlq_id: str
    who: str
    at_ms: int


def claim_active(claim: Claim | None, now_ms: int, ttl_ms: int = CLAIM_TTL_MS) -> bool:
    """Whether ``claim`` still blocks other actions at ``now_ms``."""
    return claim is not None and now_ms - claim.at_ms < ttl_ms


@dataclass(frozen=True, slots=True)
class EventState:
    """Per event key: the version of its state, its re-injections (every generation) and open claim."""

    version: int = 0
    reinjections: int = 0
    claim: Claim | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        claim = self.claim
        return {
            "version": self.version,
            "reinjections": self.reinjections,
            "claim": None if claim is None else [claim.token, claim.dlq_id, claim.who, claim.at_ms],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EventState:
        """Inverse of :meth:`as_dict`."""
        raw = data.get("claim")
        claim = Claim(raw[0], raw[1], raw[2], int(raw[3])) if raw else None
        return cls(int(data["version"]), int(data["reinjections"]), claim)


@dataclass(frozen=True, slots=True)
class StateChange:
    """One operator action as produced to the state topic: the full new state and its base version."""

    change_id: str
    event_key: str
    base_version: int
    dlq_id: str
    entry: EntryState
    reinjections: int
    claim: Claim | None = None

    @property
    def event(self) -> EventState:
        """The event's state once this change is accepted."""
        return EventState(self.base_version + 1, self.reinjections, self.claim)

    def to_json(self) -> bytes:
        """Wire form (the value of a state-topic record)."""
        return orjson.dumps(
            {
                "change_id": self.change_id,
                "event_key": self.event_key,
                "base_version": self.base_version,
                "dlq_id": self.dlq_id,
                "entry": self.entry.as_dict(),
                "event": self.event.as_dict(),
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> StateChange:
        """Inverse of :meth:`to_json` (``ValueError``/``KeyError`` for a malformed record)."""
        data = orjson.loads(raw)
        event = EventState.from_dict(data["event"])
        return cls(
            change_id=str(data["change_id"]),
            event_key=str(data["event_key"]),
            base_version=int(data["base_version"]),
            dlq_id=str(data["dlq_id"]),
            entry=EntryState.from_dict(data["entry"]),
            reinjections=event.reinjections,
            claim=event.claim,
        )


def apply_change(current: EventState, change: StateChange) -> EventState | None:
    """The event's state after ``change``, or ``None`` when the change was computed from another
    version than ``current`` (a concurrent action came first in the log: the change is refused)."""
    if change.base_version != current.version:
        return None
    return change.event


def state_partition(event_key: str, partitions: int) -> int:
    """The state-topic partition of ``event_key`` (stable across processes and client versions)."""
    return zlib.crc32(event_key.encode()) % partitions
