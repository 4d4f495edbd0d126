"""The lag monitor: history of snapshots -> statuses, rules and alert events -> metrics and alert sinks.

* :class:`LagEvaluator` is the pure core: it keeps a short history of snapshots and derives, at
  the snapshot's own timestamp (the injected clock), a Burrow-style status per partition and per
  group/topic (:mod:`app.ops.lag.evaluation`), the state of every rule and the alert lifecycle
  events (:mod:`app.ops.lag.lifecycle`). The history lives in memory only.
* :class:`LagMonitor` runs reader -> evaluator once per interval, exports ``CONSUMER_LAG``/
  ``LAG_ALERTS``/``LAG_STATUS`` and hands alert events to the sinks of :mod:`app.ops.alerts`
  (structured log line, and an Alertmanager-compatible webhook when ``AVCC_ALERT_WEBHOOK_URL`` is
  set).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.ops.alerts import AlertSink, default_sinks
from app.ops.console.rates import OffsetHistory
from app.ops.lag.evaluation import (
    STATUS_ORDER,
    PartitionStatus,
    RuleState,
    Sample,
    Status,
    TopicStatus,
    evaluate_rule,
    partition_status,
)
from app.ops.lag.lifecycle import AlertEvent, AlertTracker, iso_time, to_alert
from app.ops.lag.settings import LagSettings, get_lag_settings
from app.platform.lag.bounded import call_within
from app.platform.lag.reader import OffsetReader
from app.platform.lag.snapshot import BROKER_ERROR, LagSnapshot, PartitionOffsets
from app.platform.metrics import ALERTS_SENT, CONSUMER_LAG, LAG_ALERTS, LAG_MONITOR_ERRORS, LAG_STATUS
from app.platform.settings import Settings

__all__ = ["LagEvaluator", "LagMonitor", "LagReport"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LagReport:
    """What the evaluator derived from one snapshot."""

    taken_at: float
    topics: tuple[TopicStatus, ...]
    rules: tuple[RuleState, ...]
    events: tuple[AlertEvent, ...]
    errors: Mapping[str, str]

    @property
    def active_alerts(self) -> tuple[RuleState, ...]:
        """The rules firing now."""
        return tuple(r for r in self.rules if r.firing)

    def as_json(self) -> dict[str, Any]:
        """JSON-ready form (``GET /lag.json``)."""
        return {
            "taken_at": iso_time(self.taken_at),
            "errors": dict(self.errors),
            "groups": [
                {
                    "group": t.group,
                    "topic": t.topic,
                    "status": t.status,
                    "reason": t.reason,
                    "lag": t.lag,
                    "partitions": [
                        {
                            "partition": p.offsets.partition,
                            "end": p.offsets.end,
                            "committed": p.offsets.committed,
                            "lag": p.offsets.lag,
                            "status": p.status,
                            "reason": p.reason,
                        }
                        for p in t.partitions
                    ],
                }
                for t in self.topics
            ],
            "alerts": [
                {
                    "rule": r.rule.name,
                    "group": r.group,
                    "topic": r.topic,
                    "lag": r.lag,
                    "severity": r.rule.severity,
                    "reason": r.reason,
                    "recommendation": r.rule.action,
                }
                for r in self.active_alerts
            ],
        }


class LagEvaluator:
    """The pure core: feed it snapshots in time order, get reports. No I/O, no clock of its own."""

    def __init__(self, config: LagSettings) -> None:
        self.config = config
        self.tracker = AlertTracker(config.repeat_s)
        self._partitions: dict[tuple[str, str, int], deque[Sample]] = {}
        self._totals: dict[tuple[str, str], deque[tuple[float, int]]] = {}
        self._last: LagReport | None = None

    @property
    def last_report(self) -> LagReport | None:
        """The report of the latest snapshot."""
        return self._last

    def observe(self, snapshot: LagSnapshot) -> LagReport:
        """Add ``snapshot`` to the history and evaluate statuses, rules and alert events at its time."""
        now = snapshot.taken_at
        if BROKER_ERROR in snapshot.errors:
            report = self._broker_error(snapshot)
            self._last = report
            return report
        horizon = now - self.config.history_s
        by_pair: dict[tuple[str, str], list[PartitionOffsets]] = {}
        seen: set[tuple[str, str, int]] = set()
        for offsets in snapshot.partitions:
            key = (offsets.group, offsets.topic, offsets.partition)
            seen.add(key)
            history = self._partitions.setdefault(key, deque())
            history.append(Sample(now, offsets.committed, offsets.lag))
            _prune(history, horizon, lambda s: s.at)
            by_pair.setdefault((offsets.group, offsets.topic), []).append(offsets)
        for key in [k for k in self._partitions if k not in seen]:
            del self._partitions[key]
        for pair, parts in by_pair.items():
            totals = self._totals.setdefault(pair, deque())
            totals.append((now, sum(p.lag for p in parts)))
            _prune(totals, horizon, lambda s: s[0])
        for pair in [p for p in self._totals if p not in by_pair]:
            del self._totals[pair]

        topics: list[TopicStatus] = []
        for (group, topic), parts in sorted(by_pair.items()):
            statuses: list[PartitionStatus] = []
            for offsets in sorted(parts, key=lambda p: p.partition):
                if group in snapshot.errors:
                    status: Status = "ERR"
                    reason = snapshot.errors[group]
                else:
                    samples = self._partitions[(group, topic, offsets.partition)]
                    status, reason = partition_status(
                        list(samples), now, self.config.window_s, snapshot.groups.get(group)
                    )
                statuses.append(PartitionStatus(offsets, status, reason))
            worst = max(statuses, key=lambda s: STATUS_ORDER[s.status])
            reason = worst.reason if worst.status == "OK" else f"p{worst.offsets.partition}: {worst.reason}"
            topics.append(
                TopicStatus(group, topic, worst.status, reason, sum(p.lag for p in parts), tuple(statuses))
            )
        for group, message in sorted(snapshot.errors.items()):
            if not any(t.group == group for t in topics):
                topics.append(TopicStatus(group, "", "ERR", message, 0, ()))

        rules: list[RuleState] = []
        for rule in self.config.rules:
            for group in rule.groups:
                totals = self._totals.get((group, rule.topic), deque())
                rules.append(evaluate_rule(rule, group, list(totals), now, (group, rule.topic) in by_pair))
        events = self.tracker.update(now, rules)
        report = LagReport(now, tuple(topics), tuple(rules), tuple(events), dict(snapshot.errors))
        self._last = report
        return report

    def _broker_error(self, snapshot: LagSnapshot) -> LagReport:
        """The broker could not be read: keep alerts as they are, mark everything known ERR."""
        message = snapshot.errors[BROKER_ERROR]
        previous = self._last
        topics = tuple(
            TopicStatus(t.group, t.topic, "ERR", message, t.lag, t.partitions)
            for t in (previous.topics if previous else ())
        )
        rules = previous.rules if previous else ()
        return LagReport(snapshot.taken_at, topics, rules, (), dict(snapshot.errors))


def _prune(history: deque[Any], horizon: float, at: Callable[[Any], float]) -> None:
    """Drop samples older than ``horizon`` but keep one at or before it (the window's anchor)."""
    while len(history) >= 2 and at(history[1]) <= horizon:
        history.popleft()


#: A lag snapshot is given up after this many of the reader's request timeouts (it makes several
#: requests per group).
SNAPSHOT_TIMEOUTS = 6


class LagMonitor:
    """Reader -> evaluator -> metrics and alert sinks; :meth:`tick` once per interval."""

    def __init__(
        self,
        settings: Settings,
        config: LagSettings | None = None,
        *,
        reader: OffsetReader | None = None,
        reader_factory: Callable[[], OffsetReader] | None = None,
        sinks: Sequence[AlertSink] | None = None,
        generator_url: str | None = None,
    ) -> None:
        self.settings = settings
        self.config = config if config is not None else get_lag_settings()
        #: Makes the reader that replaces one whose snapshot did not answer.
        self.reader_factory: Callable[[], OffsetReader] = reader_factory or (
            lambda: OffsetReader(settings, watched=self.config.watched())
        )
        self.reader = reader if reader is not None else self.reader_factory()
        self.evaluator = LagEvaluator(self.config)
        #: Offsets over the last minutes: the console's rates and trend charts.
        self.history = OffsetHistory()
        self.sinks: list[AlertSink] = list(sinks) if sinks is not None else default_sinks(settings)
        self.generator_url = generator_url
        self._exported: set[tuple[str, str, str]] = set()
        self._status_exported: set[tuple[str, str]] = set()

    @property
    def last_report(self) -> LagReport | None:
        """The latest report (``None`` before the first tick)."""
        return self.evaluator.last_report

    def snapshot_timeout_s(self) -> float:
        """Longest wait for one snapshot: several of the reader's request timeouts."""
        return SNAPSHOT_TIMEOUTS * self.reader.request_timeout_s

    async def take_snapshot(self) -> LagSnapshot:
        """The reader's snapshot; an error snapshot (``BROKER_ERROR``) if it does not answer within
        :meth:`snapshot_timeout_s`, after which a fresh reader replaces it (see
        :mod:`app.platform.lag.bounded`): a monitor waiting for ever would stop every lag alert."""
        reader = self.reader
        timeout = self.snapshot_timeout_s()
        try:
            return await call_within(reader.snapshot, timeout, reader.close)
        except TimeoutError:
            LAG_MONITOR_ERRORS.labels(stage="snapshot").inc()
            log.warning("lag snapshot did not answer in %.0f s; asking a new reader next time", timeout)
            reader.abort()  # its thread stops at its next request instead of reading on for minutes
            self.reader = self.reader_factory()
            return LagSnapshot(
                time.time(), errors={BROKER_ERROR: f"snapshot did not answer in {timeout:.0f} s"}
            )

    async def tick(self) -> LagReport:
        """Take a snapshot, evaluate it, export metrics and send alert events."""
        snapshot = await self.take_snapshot()
        report = self.evaluator.observe(snapshot)
        self.history.add(snapshot)
        self.export(snapshot, report)
        if report.events:
            await self.notify(report.events)
        return report

    async def notify(self, events: Sequence[AlertEvent]) -> None:
        """Hand lifecycle events to every sink (sinks log their own failures and never raise)."""
        alerts = [
            to_alert(e, repeat_s=self.config.repeat_s, generator_url=self.generator_url) for e in events
        ]
        for event in events:
            log.info("lag alert %s: %s", event.kind, orjson.dumps(event.as_log()).decode())
        results = await asyncio.gather(*(sink.send(alerts) for sink in self.sinks), return_exceptions=True)
        for sink, result in zip(self.sinks, results, strict=True):
            if isinstance(result, BaseException):
                LAG_MONITOR_ERRORS.labels(stage="alert_sink").inc()
                log.error("alert sink %s raised: %r", type(sink).__name__, result)
        for alert in alerts:
            ALERTS_SENT.labels(alert.name).inc()

    def export(self, snapshot: LagSnapshot, report: LagReport) -> None:
        """Set the lag, status and alert gauges; drop series of partitions no longer seen."""
        if BROKER_ERROR in snapshot.errors:
            return
        current: set[tuple[str, str, str]] = set()
        for offsets in snapshot.partitions:
            labels = (offsets.group, offsets.topic, str(offsets.partition))
            CONSUMER_LAG.labels(*labels).set(offsets.lag)
            current.add(labels)
        for labels in self._exported - current:
            _remove(CONSUMER_LAG, labels)
        self._exported = current
        statuses: set[tuple[str, str]] = set()
        for topic in report.topics:
            if topic.topic:
                LAG_STATUS.labels(topic.group, topic.topic).set(STATUS_ORDER[topic.status])
                statuses.add((topic.group, topic.topic))
        for pair in self._status_exported - statuses:
            _remove(LAG_STATUS, pair)
        self._status_exported = statuses
        for state in report.rules:
            LAG_ALERTS.labels(state.rule.name, state.group, state.topic).set(1 if state.firing else 0)

    async def close(self) -> None:
        """Close the reader's clients (off the event loop: it waits for a running snapshot) and the sinks."""
        await asyncio.to_thread(self.reader.close)
        for sink in self.sinks:
            try:
                await sink.close()
            except Exception as exc:  # one sink's cleanup must not stop the others
                log.warning("closing alert sink %s failed: %r", type(sink).__name__, exc)


def _remove(metric: Any, labels: Sequence[str]) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
