"""Alerts: the ``Alert`` record, pluggable sinks (log, Alertmanager webhook), a de-duplicating dispatcher.

Any part of the pipeline that raises an alert (the DLQ indexer for dead letters, the lag monitor for
consumer lag) builds an :class:`Alert` and hands it to an :class:`AlertDispatcher`, which merges
repeats of the same alert (same values of its ``key_labels``) within a window and fans the rest out
to every :class:`AlertSink`. Sinks never raise: a broken webhook is logged, never a crashed worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import aiohttp
import orjson

from app.platform.metrics import ALERTS_SENT, ALERTS_SUPPRESSED
from app.platform.settings import Settings

__all__ = [
    "DEAD_LETTER_ALERT",
    "Alert",
    "AlertDispatcher",
    "AlertSink",
    "LogAlertSink",
    "WebhookAlertSink",
    "dead_letter_alert",
    "default_sinks",
    "dispatcher_from_settings",
]

log = logging.getLogger(__name__)

#: ``alertname`` of the P2 alert raised for every new dead letter (seed 9.3.3).
DEAD_LETTER_ALERT = "AvccDeadLetter"


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    """RFC 3339 / ISO 8601 in UTC with a ``Z`` suffix, as Alertmanager prints it."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert in Alertmanager's model: identifying labels, descriptive annotations, a time span."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    starts_at: datetime = field(default_factory=_utc_now)
    #: ``None``: firing until Alertmanager's resolve timeout; set it to resolve the alert.
    ends_at: datetime | None = None
    generator_url: str | None = None

    @property
    def name(self) -> str:
        """The ``alertname`` label ("" when missing)."""
        return self.labels.get("alertname", "")

    def to_alertmanager(self) -> dict[str, Any]:
        """One element of Alertmanager's ``POST /api/v2/alerts`` array."""
        body: dict[str, Any] = {
            "labels": {str(k): str(v) for k, v in self.labels.items()},
            "annotations": {str(k): str(v) for k, v in self.annotations.items()},
            "startsAt": _iso(self.starts_at),
        }
        if self.ends_at is not None:
            body["endsAt"] = _iso(self.ends_at)
        if self.generator_url:
            body["generatorURL"] = self.generator_url
        return body


@runtime_checkable
class AlertSink(Protocol):
    """Where alerts go. ``send`` must not raise; it logs its own failures."""

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Deliver ``alerts``."""

    async def close(self) -> None:
        """Release connections."""


class LogAlertSink:
    """Writes each alert as one structured log line (always on)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("avcc.alerts")

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Log every alert at WARNING (labels and annotations as compact JSON)."""
        for alert in alerts:
            self.log.warning(
                "ALERT %s labels=%s annotations=%s startsAt=%s",
                alert.name,
                orjson.dumps(dict(alert.labels), option=orjson.OPT_SORT_KEYS).decode(),
                orjson.dumps(dict(alert.annotations), option=orjson.OPT_SORT_KEYS).decode(),
                _iso(alert.starts_at),
            )

    async def close(self) -> None:
        """Nothing to release."""


class WebhookAlertSink:
    """POSTs alerts as an Alertmanager-compatible JSON array (``/api/v2/alerts`` or any webhook).

    Errors (connection refused, timeouts, non-2xx answers) are logged and counted, never raised.
    """

    def __init__(
        self, url: str, *, timeout_s: float = 5.0, session: aiohttp.ClientSession | None = None
    ) -> None:
        self.url = url
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session = session
        self._own_session = session is None
        self.failures = 0

    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
            self._own_session = True
        return self._session

    async def send(self, alerts: Sequence[Alert]) -> None:
        """POST ``alerts``; log (and count in ``failures``) anything but a 2xx answer."""
        if not alerts:
            return
        body = orjson.dumps([a.to_alertmanager() for a in alerts])
        try:
            session = await self._client()
            async with session.post(
                self.url, data=body, headers={"Content-Type": "application/json"}, timeout=self.timeout
            ) as response:
                if response.status >= 300:
                    text = (await response.text())[:500]
                    self.failures += 1
                    log.error("alert webhook %s answered %d: %s", self.url, response.status, text)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.failures += 1
            log.error("alert webhook %s failed: %s: %s", self.url, type(exc).__name__, exc)

    async def close(self) -> None:
        """Close the HTTP session this sink opened."""
        if self._session is not None and self._own_session and not self._session.closed:
            await self._session.close()
        self._session = None


@dataclass(slots=True)
class _Seen:
    sent_at: float
    suppressed: int = 0


class AlertDispatcher:
    """Fans alerts out to sinks, merging repeats within ``window_s``.

    Alerts are "the same" when the labels named in ``key_labels`` are equal (missing labels count as
    ""). The first one is sent; the ones that follow within the window are suppressed and counted;
    the first one after the window goes out with annotation ``suppressed_count`` = how many were
    merged into it. The default key is ``(alertname, group, error_class)``; the lag monitor can
    build its own dispatcher with e.g. ``("alertname", "group", "topic")``.
    """

    def __init__(
        self,
        sinks: Sequence[AlertSink],
        window_s: float,
        *,
        key_labels: Sequence[str] = ("alertname", "group", "error_class"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sinks = list(sinks)
        self.window_s = window_s
        self.key_labels = tuple(key_labels)
        self.clock = clock
        self._seen: dict[tuple[str, ...], _Seen] = {}

    def key(self, alert: Alert) -> tuple[str, ...]:
        """The de-duplication key of ``alert``."""
        return tuple(alert.labels.get(label, "") for label in self.key_labels)

    def suppressed(self, alert: Alert) -> int:
        """How many alerts like ``alert`` were suppressed since the last one was sent."""
        seen = self._seen.get(self.key(alert))
        return seen.suppressed if seen is not None else 0

    def admit(self, alert: Alert) -> Alert | None:
        """Decide synchronously: the alert to send (annotated), or ``None`` when suppressed."""
        key = self.key(alert)
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen.sent_at < self.window_s:
            seen.suppressed += 1
            ALERTS_SUPPRESSED.labels(alert.name).inc()
            return None
        merged = seen.suppressed if seen is not None else 0
        self._seen[key] = _Seen(sent_at=now)
        self._expire(now)
        if merged:
            alert = replace(alert, annotations={**alert.annotations, "suppressed_count": str(merged)})
        return alert

    def _expire(self, now: float) -> None:
        if len(self._seen) > 10_000:
            horizon = now - self.window_s
            for key in [k for k, v in self._seen.items() if v.sent_at < horizon and not v.suppressed]:
                del self._seen[key]

    async def dispatch(self, alert: Alert) -> bool:
        """Send ``alert`` to every sink unless it is a repeat within the window; True if sent."""
        admitted = self.admit(alert)
        if admitted is None:
            return False
        await self.send_now([admitted])
        return True

    async def send_now(self, alerts: Sequence[Alert]) -> None:
        """Send without de-duplication (e.g. resolutions); sink errors are logged."""
        results = await asyncio.gather(*(sink.send(alerts) for sink in self.sinks), return_exceptions=True)
        for sink, result in zip(self.sinks, results, strict=True):
            if isinstance(result, BaseException):
                log.error("alert sink %s raised: %r", type(sink).__name__, result)
        for alert in alerts:
            ALERTS_SENT.labels(alert.name).inc()

    async def close(self) -> None:
        """Close every sink."""
        for sink in self.sinks:
            try:
                await sink.close()
            except Exception as exc:  # a sink's cleanup must not stop the others
                log.warning("closing alert sink %s failed: %r", type(sink).__name__, exc)


def default_sinks(settings: Settings) -> list[AlertSink]:
    """The log sink, plus the webhook sink when ``AVCC_ALERT_WEBHOOK_URL`` is set."""
    sinks: list[AlertSink] = [LogAlertSink()]
    if settings.alert_webhook_url:
        sinks.append(WebhookAlertSink(settings.alert_webhook_url))
    return sinks


def dispatcher_from_settings(
    settings: Settings, *, key_labels: Sequence[str] = ("alertname", "group", "error_class")
) -> AlertDispatcher:
    """A dispatcher with :func:`default_sinks` and ``AVCC_ALERT_DEDUP_WINDOW_S``."""
    return AlertDispatcher(default_sinks(settings), settings.alert_dedup_window_s, key_labels=key_labels)


def dead_letter_alert(
    *,
    group: str,
    error_class: str,
    topic: str,
    dlq_id: str,
    error_message: str,
    event_id: str | None = None,
    console_url: str | None = None,
    starts_at: datetime | None = None,
) -> Alert:
    """The P2 alert of seed 9.3.3 for a message that reached the DLQ."""
    annotations = {
        "summary": f"message of {topic} dead-lettered by group {group}: {error_class}",
        "description": error_message[:1000],
        "dlq_id": dlq_id,
        "topic": topic,
    }
    if event_id:
        annotations["event_id"] = event_id
    return Alert(
        labels={
            "alertname": DEAD_LETTER_ALERT,
            "severity": "P2",
            "group": group,
            "error_class": error_class,
        },
        annotations=annotations,
        starts_at=starts_at or _utc_now(),
        generator_url=f"{console_url.rstrip('/')}/dlq/{dlq_id}" if console_url else None,
    )
