"""A dead letter as the DLQ index keeps it: the raw record, its failure metadata, status and audit trail.

A message's ``dlq_id`` is ``{partition}-{offset}`` of the DLQ record. Its status is ``new`` until
an operator re-injects it into its original topic (``reinjected``) or discards it with a reason
(``discarded``); every action lands in the audit trail.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, get_args

import orjson

from app.platform.errors import AvccError
from schemas.system import FailureMetadata

__all__ = [
    "STATUSES",
    "AuditEntry",
    "DiscardRefused",
    "DlqEntry",
    "DlqError",
    "DlqNotFound",
    "ReinjectRefused",
    "Status",
    "iso_ms",
]

Status = Literal["new", "reinjected", "discarded"]
STATUSES: Final[tuple[Status, ...]] = get_args(Status)


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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditEntry:
        """Inverse of :meth:`as_dict` (the ISO timestamp is derived, so ignored)."""
        return cls(data["at_ms"], data["who"], data["action"], data.get("reason"), data.get("detail"))


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
            audit=[AuditEntry.from_dict(a) for a in data["audit"]],
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
