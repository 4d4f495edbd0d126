"""Which dead letters an operator means: list filters and the outcome of a bulk re-injection."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.ops.dlq.entries import STATUSES, DlqEntry, Status

__all__ = ["BulkResult", "DlqFilter"]


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
            digits = value.removeprefix("-")
            if digits.isascii() and digits.isdigit():
                if len(digits) > 13:  # beyond year 2286: a typo, not a time (and past int64)
                    raise ValueError(f"{name}: epoch ms out of range: {value[:64]!r}")
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
