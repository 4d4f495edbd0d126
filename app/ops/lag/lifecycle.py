"""Lag alert lifecycle: fire once, repeat every ``repeat_s`` while active, resolve once.

The lifecycle is decided here (not by :class:`app.ops.alerts.AlertDispatcher`, whose
de-duplication the monitor bypasses); :func:`to_alert` turns each event into the
:class:`app.ops.alerts.Alert` the sinks send (structured log line, Alertmanager webhook).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from app.ops.alerts import Alert
from app.ops.lag.evaluation import RuleState
from app.ops.lag.settings import LagRule

__all__ = ["AlertEvent", "AlertKind", "AlertTracker", "alertmanager_payload", "iso_time", "to_alert"]

AlertKind = Literal["firing", "repeat", "resolved"]


def iso_time(ts: float) -> str:
    """``2026-06-02T10:30:00.000Z`` for a time in seconds since the epoch."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """A notification of the alert lifecycle."""

    kind: AlertKind
    rule: LagRule
    group: str
    topic: str
    lag: int
    reason: str
    started_at: float
    at: float

    def labels(self) -> dict[str, str]:
        """Alertmanager labels (identity of the alert)."""
        labels = {
            "alertname": self.rule.name,
            "severity": self.rule.severity,
            "group": self.group,
            "topic": self.topic,
            "service": "avcc",
        }
        if self.rule.scale_group:
            labels["scale_group"] = self.rule.scale_group
        return labels

    def as_log(self) -> dict[str, Any]:
        """The structured log record."""
        return {
            "event": "lag_alert",
            "kind": self.kind,
            **self.labels(),
            "lag": self.lag,
            "reason": self.reason,
            "recommendation": self.rule.action,
            "started_at": iso_time(self.started_at),
            "at": iso_time(self.at),
        }


@dataclass(slots=True)
class _Active:
    started_at: float
    last_sent_at: float


class AlertTracker:
    """Alert lifecycle: fire once, repeat every ``repeat_s`` while active, resolve once."""

    def __init__(self, repeat_s: float) -> None:
        self.repeat_s = repeat_s
        self._active: dict[tuple[str, str, str], _Active] = {}

    @property
    def active(self) -> frozenset[tuple[str, str, str]]:
        """Keys ``(rule, group, topic)`` of the active alerts."""
        return frozenset(self._active)

    def update(self, now: float, states: Iterable[RuleState]) -> list[AlertEvent]:
        """Events caused by the rule states observed at ``now``."""
        events: list[AlertEvent] = []
        for state in states:
            key = (state.rule.name, state.group, state.topic)
            active = self._active.get(key)
            if state.firing and active is None:
                self._active[key] = _Active(started_at=now, last_sent_at=now)
                events.append(self._event("firing", state, now, now))
            elif state.firing and active is not None:
                if now - active.last_sent_at >= self.repeat_s:
                    active.last_sent_at = now
                    events.append(self._event("repeat", state, active.started_at, now))
            elif active is not None:
                del self._active[key]
                events.append(self._event("resolved", state, active.started_at, now))
        return events

    @staticmethod
    def _event(kind: AlertKind, state: RuleState, started_at: float, now: float) -> AlertEvent:
        return AlertEvent(
            kind, state.rule, state.group, state.topic, state.lag, state.reason, started_at, now
        )


def to_alert(event: AlertEvent, *, repeat_s: float, generator_url: str | None = None) -> Alert:
    """The :class:`app.ops.alerts.Alert` of a lifecycle event.

    A firing alert's ``endsAt`` lies three repeat intervals ahead, so Alertmanager keeps it while
    the monitor keeps re-sending and lets it lapse if the monitor dies; a resolved one ends now.
    """
    ends = event.at if event.kind == "resolved" else event.at + 3 * repeat_s
    return Alert(
        labels=event.labels(),
        annotations={
            "summary": event.rule.summary or f"consumer lag on {event.topic}",
            "description": f"{event.group} on {event.topic}: {event.reason}",
            "recommendation": event.rule.action,
            "lag": str(event.lag),
            "status": event.kind,
        },
        starts_at=datetime.fromtimestamp(event.started_at, UTC),
        ends_at=datetime.fromtimestamp(ends, UTC),
        generator_url=generator_url,
    )


def alertmanager_payload(
    events: Sequence[AlertEvent], *, repeat_s: float, generator_url: str | None = None
) -> list[dict[str, Any]]:
    """Alertmanager ``POST /api/v2/alerts`` body for ``events``."""
    return [to_alert(e, repeat_s=repeat_s, generator_url=generator_url).to_alertmanager() for e in events]
