"""Consumer-lag monitor: offset snapshots, Burrow-style status and the seed's lag alert rules (9.3.4).

Three layers, so the logic is testable without a broker:

* I/O in: :class:`OffsetReader` takes a :class:`LagSnapshot` of every consumer group (groups from
  ``AdminClient.list_consumer_groups``, group state from ``describe_consumer_groups``, committed
  offsets from a never-subscribing consumer of each group (``Consumer.committed``; the admin
  ``list_consumer_group_offsets`` can crash librdkafka, see :meth:`OffsetReader._committed`), end
  offsets from ``get_watermark_offsets``).
* Pure core: :class:`LagEvaluator` keeps a short history of snapshots and derives, at the
  snapshot's own timestamp (the injected clock), a Burrow-style status per partition and per
  group/topic, the state of every :class:`LagRule` and the alert lifecycle events
  (fire once, repeat every ``repeat_s`` while active, resolve once).
* I/O out: :class:`LagMonitor` runs reader -> evaluator, exports ``CONSUMER_LAG``/``LAG_ALERTS``/
  ``LAG_STATUS`` and hands alert events to the sinks of :mod:`app.ops.alerts` (structured log line,
  and an Alertmanager-compatible webhook when ``AVCC_ALERT_WEBHOOK_URL`` is set). The lifecycle
  (repeat/resolve) is decided here, so the dispatcher's de-duplication is bypassed.

Status per partition (and per group/topic = the worst of its partitions)::

    OK     lag is 0, or the consumer is moving and lag is not steadily growing
    WARN   committed offset moves but lag grew at every sample across the whole window
    STALL  lag > 0, committed offset frozen for the whole window, group has live members
    STOP   lag > 0 and the group has no members, or nothing was committed for the whole window
           while nobody (known) is alive to commit
    ERR    the offsets of the group could not be read

End offsets: Tansu (the embedded dev broker) reports the base offset of the last batch + 1 as the
end offset, so its lag reads far too low. With ``AVCC_LAG_PROBE_END_OFFSETS=true`` (default: on in
dev mode) the reader fetches the tail of every partition once per snapshot and takes the high
watermark of that fetch response, which is exact on both Tansu and Kafka. A committed offset past
the reported end never yields a negative lag (clamped to 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.ops.alerts import Alert, AlertSink, default_sinks
from app.platform.faust.app import consumer_group_id, tansu_like_broker
from app.platform.metrics import ALERTS_SENT, CONSUMER_LAG, LAG_ALERTS, LAG_MONITOR_ERRORS, LAG_STATUS
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, PLAYBACK_EVENT, spec_for

__all__ = [
    "STATUS_ORDER",
    "AlertEvent",
    "AlertTracker",
    "GroupState",
    "LagEvaluator",
    "LagMonitor",
    "LagReport",
    "LagRule",
    "LagSettings",
    "LagSnapshot",
    "OffsetReader",
    "PartitionOffsets",
    "PartitionStatus",
    "RuleState",
    "Status",
    "TopicStatus",
    "alertmanager_payload",
    "default_rules",
    "format_lag_table",
    "partition_status",
    "print_lag_table",
    "render_lag_html",
    "to_alert",
]

log = logging.getLogger(__name__)

Status = Literal["OK", "WARN", "STALL", "STOP", "ERR"]
#: Severity order of the statuses (a group/topic takes the worst status of its partitions).
STATUS_ORDER: dict[Status, int] = {"OK": 0, "WARN": 1, "STALL": 2, "STOP": 3, "ERR": 4}
AlertKind = Literal["firing", "repeat", "resolved"]

#: Group states (librdkafka ``ConsumerGroupState`` names) meaning "members are alive".
_ALIVE_STATES = frozenset({"STABLE", "PREPARING_REBALANCE", "COMPLETING_REBALANCE"})
#: Group states meaning "nobody is consuming".
_DEAD_STATES = frozenset({"EMPTY", "DEAD"})
#: Key of :attr:`LagSnapshot.errors` for a failure that is not specific to one group.
BROKER_ERROR = "*"


# ----------------------------------------------------------------------------- configuration


class LagRule(BaseModel):
    """One alert rule on the lag of ``topic`` as consumed by each group of ``groups``.

    It fires for a (group, topic) while the total lag over the topic's partitions is above
    ``max_lag``, or while the lag has been > 0 (at least ``not_shrinking_min_lag``) and has not
    shrunk (least-squares slope >= 0) for ``not_shrinking_s`` seconds.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Alert name (label `alertname`).")
    topic: str = Field(description="Topic whose lag is watched.")
    groups: tuple[str, ...] = Field(description="Kafka consumer group ids (e.g. `avcc-review`).")
    max_lag: int | None = Field(None, description="Fire when the total lag exceeds this.")
    not_shrinking_s: float | None = Field(
        None, description="Fire when lag > 0 has not shrunk for this many seconds."
    )
    not_shrinking_min_lag: int = Field(1, description="Lag from which the not-shrinking rule applies.")
    severity: str = Field("P2", description="Label `severity`.")
    summary: str = Field("", description="Annotation `summary`.")
    action: str = Field("", description="Annotation `recommendation`: what the operator should do.")
    scale_group: str | None = Field(None, description="Agent group to scale out (label `scale_group`).")


def default_rules() -> tuple[LagRule, ...]:
    """The seed's rules (9.3.4), keyed by the topic plan's names and partition counts."""
    apply_parts = spec_for(APPLY_CREATED.name).partitions
    playback_parts = spec_for(PLAYBACK_EVENT.name).partitions
    return (
        LagRule(
            name="AvccApplyCreatedLag",
            topic=APPLY_CREATED.name,
            groups=(consumer_group_id("review"),),
            max_lag=1000,
            not_shrinking_s=60.0,
            severity="P2",
            summary="review-svc is falling behind on applications (O-class works must be coded in seconds)",
            action=f"scale out review-svc: add `avcc worker review` replicas (KEDA does it automatically; "
            f"at most {apply_parts} = partitions of {APPLY_CREATED.name})",
            scale_group="review",
        ),
        LagRule(
            name="AvccPlaybackEventLag",
            topic=PLAYBACK_EVENT.name,
            groups=(consumer_group_id("sink"), consumer_group_id("anomaly")),
            max_lag=50_000,
            severity="P2",
            summary="playback events pile up",
            action="check the ClickHouse sink: insert latency and failures "
            "(avcc_clickhouse_insert_seconds / avcc_clickhouse_insert_failures_total), then scale out "
            f"(at most {playback_parts} = partitions of {PLAYBACK_EVENT.name})",
        ),
    )


class LagSettings(BaseSettings):
    """Lag monitor knobs, read from ``AVCC_LAG_*`` environment variables.

    ``AVCC_LAG_RULES`` is a JSON list of :class:`LagRule` objects and replaces the defaults.
    """

    model_config = SettingsConfigDict(env_prefix="AVCC_LAG_", frozen=True, extra="ignore")

    rules: tuple[LagRule, ...] = Field(
        default_factory=default_rules, description="Alert rules as JSON (default: the seed's 9.3.4)."
    )
    interval_s: float = Field(5.0, description="Seconds between two snapshots.")
    window_s: float = Field(60.0, description="Evaluation window of the WARN/STALL/STOP status.")
    repeat_s: float = Field(300.0, description="Re-send a still-active alert this often.")
    group_prefix: str = Field("", description="Only watch groups whose id starts with this.")
    request_timeout_s: float = Field(10.0, description="Timeout of each admin/offset request.")
    probe_end_offsets: bool | None = Field(
        None,
        description="Fetch each partition's tail to learn the exact end offset (needed on Tansu, "
        "whose reported end offsets lag). Default: on when the broker is Tansu-like.",
    )
    export_interval_s: float = Field(
        10.0, description="How often every worker exports the lag of its own partitions."
    )

    @property
    def history_s(self) -> float:
        """How far back the evaluator keeps samples."""
        spans = [self.window_s, *(r.not_shrinking_s or 0.0 for r in self.rules)]
        return max(spans) + 2 * self.interval_s


# ----------------------------------------------------------------------------- snapshot


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """Offsets of one group on one partition. ``committed`` is ``None`` if never committed."""

    group: str
    topic: str
    partition: int
    end: int
    committed: int | None
    low: int = 0

    @property
    def lag(self) -> int:
        """End minus committed (minus the low watermark if never committed), never negative."""
        base = self.committed if self.committed is not None else self.low
        return max(0, self.end - base)


@dataclass(frozen=True, slots=True)
class GroupState:
    """What the broker says about a group: its state and member count (``None`` if unknown)."""

    group: str
    state: str = "UNKNOWN"
    members: int | None = None

    @property
    def alive(self) -> bool | None:
        """True if members are consuming, False if none, ``None`` if the broker did not say."""
        if self.state in _DEAD_STATES:
            return False
        if self.state in _ALIVE_STATES:
            return True
        return None


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    """All groups' offsets at ``taken_at`` (seconds since the epoch)."""

    taken_at: float
    partitions: tuple[PartitionOffsets, ...] = ()
    groups: Mapping[str, GroupState] = field(default_factory=dict)
    #: group id (or :data:`BROKER_ERROR`) -> error message
    errors: Mapping[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------------------- evaluation


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """Status of one partition of a group at the report's time."""

    offsets: PartitionOffsets
    status: Status
    reason: str


@dataclass(frozen=True, slots=True)
class TopicStatus:
    """Status of a group on a topic: the worst partition's status, total lag."""

    group: str
    topic: str
    status: Status
    reason: str
    lag: int
    partitions: tuple[PartitionStatus, ...]


@dataclass(frozen=True, slots=True)
class RuleState:
    """Whether ``rule`` fires for ``group``/``topic`` now, and why."""

    rule: LagRule
    group: str
    topic: str
    firing: bool
    lag: int
    reason: str


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
            "started_at": _iso(self.started_at),
            "at": _iso(self.at),
        }


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
            "taken_at": _iso(self.taken_at),
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


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    committed: int | None
    lag: int


def _window(samples: Sequence[_Sample], now: float, span: float) -> tuple[list[_Sample], bool]:
    """Samples within ``[now - span, now]`` plus the latest one before (the anchor).

    The flag says whether the history covers the whole span (an anchor exists).
    """
    start = now - span
    anchor: _Sample | None = None
    inside: list[_Sample] = []
    for sample in samples:
        if sample.at <= start:
            anchor = sample
        else:
            inside.append(sample)
    if anchor is None:
        return inside, False
    return [anchor, *inside], True


def partition_status(
    samples: Sequence[_Sample], now: float, window_s: float, group: GroupState | None
) -> tuple[Status, str]:
    """Burrow-style status of one partition from its samples (oldest first, last = now)."""
    if not samples:
        return "OK", "no data"
    current = samples[-1]
    if current.lag == 0:
        return "OK", "no lag"
    alive = group.alive if group is not None else None
    if alive is False:
        return "STOP", f"lag {current.lag} and the group has no members"
    window, covered = _window(samples, now, window_s)
    if not covered:
        return "OK", f"lag {current.lag} (history shorter than the {window_s:g}s window)"
    committed = {s.committed for s in window}
    frozen = len(committed) == 1
    if frozen:
        if next(iter(committed)) is None and alive is not True:
            return "STOP", f"lag {current.lag} and nothing committed for {window_s:g}s"
        if alive is True:
            return "STALL", f"lag {current.lag}, committed offset frozen for {window_s:g}s with live members"
        return "STOP", f"lag {current.lag}, no commit for {window_s:g}s"
    lags = [s.lag for s in window]
    if len(lags) >= 3 and lags[-1] > lags[0] and all(b >= a for a, b in itertools.pairwise(lags)):
        return "WARN", f"lag grew from {lags[0]} to {lags[-1]} over {window_s:g}s"
    return "OK", f"lag {current.lag}, consumer moving"


def _slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope (what PromQL ``deriv`` computes)."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var


def evaluate_rule(
    rule: LagRule, group: str, totals: Sequence[tuple[float, int]], now: float, present: bool
) -> RuleState:
    """Whether ``rule`` fires for ``group`` given the history of its total lag on the topic."""
    topic = rule.topic
    if not present or not totals:
        return RuleState(rule, group, topic, False, 0, "topic not found")
    lag = totals[-1][1]
    if rule.max_lag is not None and lag > rule.max_lag:
        return RuleState(rule, group, topic, True, lag, f"lag {lag} > {rule.max_lag}")
    if rule.not_shrinking_s is not None and lag >= max(1, rule.not_shrinking_min_lag):
        samples = [_Sample(t, None, v) for t, v in totals]
        window, covered = _window(samples, now, rule.not_shrinking_s)
        if covered and all(s.lag >= max(1, rule.not_shrinking_min_lag) for s in window):
            slope = _slope([(s.at, float(s.lag)) for s in window])
            if slope >= 0:
                return RuleState(
                    rule,
                    group,
                    topic,
                    True,
                    lag,
                    f"lag {lag} > 0 and not shrinking for {rule.not_shrinking_s:g}s",
                )
    return RuleState(rule, group, topic, False, lag, f"lag {lag}")


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


class LagEvaluator:
    """The pure core: feed it snapshots in time order, get reports. No I/O, no clock of its own."""

    def __init__(self, config: LagSettings) -> None:
        self.config = config
        self.tracker = AlertTracker(config.repeat_s)
        self._partitions: dict[tuple[str, str, int], deque[_Sample]] = {}
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
            history.append(_Sample(now, offsets.committed, offsets.lag))
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


# ----------------------------------------------------------------------------- reading offsets

#: Most group consumers kept open between snapshots (least recently used ones are closed).
_MAX_GROUP_CLIENTS = 64


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # closing a client that lost its broker must not raise
        log.debug("closing %r failed", client, exc_info=True)


class OffsetReader:
    """Reads group offsets and end offsets with confluent-kafka clients (blocking; call in a thread)."""

    def __init__(
        self,
        settings: Settings,
        config: LagSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.config = config if config is not None else LagSettings()
        self.clock = clock
        probe = self.config.probe_end_offsets
        self.probe = tansu_like_broker(settings) if probe is None else probe
        self._lock = threading.Lock()
        self._admin: Any = None
        self._consumer: Any = None
        self._group_consumers: OrderedDict[str, Any] = OrderedDict()

    # -- clients -----------------------------------------------------------------

    def _admin_client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(self.settings.kafka_client_config())
        return self._admin

    def _watermark_consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            conf: dict[str, Any] = {
                **self.settings.kafka_client_config(),
                # Never subscribes nor commits: the id only satisfies librdkafka.
                "group.id": "avcc-lag-reader",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 50,
                "max.partition.fetch.bytes": 65536,
            }
            self._consumer = Consumer(conf)
        return self._consumer

    def close(self) -> None:
        """Close the clients (idempotent)."""
        with self._lock:
            if self._consumer is not None:
                _close_quietly(self._consumer)
                self._consumer = None
            while self._group_consumers:
                _close_quietly(self._group_consumers.popitem()[1])
            self._admin = None

    # -- reads -------------------------------------------------------------------

    def snapshot(self) -> LagSnapshot:
        """Offsets of every group (ids with :attr:`LagSettings.group_prefix`, plus the rules' groups)."""
        with self._lock:
            try:
                return self._snapshot()
            except Exception as exc:  # any client failure becomes an ERR snapshot, never a crash
                LAG_MONITOR_ERRORS.labels(stage="snapshot").inc()
                log.warning("lag snapshot failed: %s", exc)
                return LagSnapshot(self.clock(), errors={BROKER_ERROR: f"{type(exc).__name__}: {exc}"})

    def group_offsets(self, group: str, partitions: Iterable[tuple[str, int]]) -> list[PartitionOffsets]:
        """Offsets of ``group`` on the given partitions (what one worker exports for itself)."""
        tps = sorted(set(partitions))
        if not tps:
            return []
        with self._lock:
            committed = self._committed(group, tps)
            marks = self._watermarks(tps)
        return [
            PartitionOffsets(group, t, p, marks[(t, p)][1], committed.get((t, p)), marks[(t, p)][0])
            for t, p in tps
            if (t, p) in marks
        ]

    def _committed(self, group: str, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        """Committed offsets of ``group`` (``None``: never committed), via a consumer of that group.

        Not ``AdminClient.list_consumer_group_offsets``: librdkafka (up to at least 2.12) crashes the
        process when that request meets a NOT_COORDINATOR answer (librdkafka#5040), which happens
        while a coordinator moves (fresh cluster, broker restart). A consumer with the group's id
        handles it; it never subscribes, so it never joins the group.
        """
        from confluent_kafka import Consumer, TopicPartition

        if not tps:
            return {}
        consumer = self._group_consumers.pop(group, None)
        if consumer is None:
            conf: dict[str, Any] = {
                **self.settings.kafka_client_config(),
                "group.id": group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
            consumer = Consumer(conf)
        self._group_consumers[group] = consumer  # most recently used last
        while len(self._group_consumers) > _MAX_GROUP_CLIENTS:
            _, oldest = self._group_consumers.popitem(last=False)
            _close_quietly(oldest)
        result = consumer.committed(
            [TopicPartition(t, p) for t, p in tps], timeout=self.config.request_timeout_s
        )
        offsets: dict[tuple[str, int], int | None] = {}
        for tp in result:
            if tp.error is not None:
                raise RuntimeError(f"committed offset of {tp.topic}[{tp.partition}]: {tp.error}")
            offsets[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
        return offsets

    def _snapshot(self) -> LagSnapshot:
        admin = self._admin_client()
        timeout = self.config.request_timeout_s
        taken_at = self.clock()
        listing = admin.list_consumer_groups(request_timeout=timeout).result(timeout=timeout + 5)
        prefix = self.config.group_prefix
        listed = {g.group_id: g for g in listing.valid}
        group_ids = {g for g in listed if g.startswith(prefix)}
        group_ids.discard("avcc-lag-reader")
        rule_pairs = {(group, rule.topic) for rule in self.config.rules for group in rule.groups}
        group_ids |= {group for group, _ in rule_pairs}
        errors: dict[str, str] = {}

        groups: dict[str, GroupState] = {}
        if group_ids:
            described = admin.describe_consumer_groups(sorted(group_ids), request_timeout=timeout)
            for group, future in described.items():
                try:
                    description = future.result(timeout=timeout + 5)
                    state = getattr(description.state, "name", str(description.state))
                    groups[group] = GroupState(group, state, len(description.members))
                except Exception as exc:  # fall back on the listing: absent there = no such group
                    log.debug("describe %s failed: %s", group, exc)
                    if group not in listed:
                        groups[group] = GroupState(group, "DEAD", 0)
                    else:
                        state = getattr(listed[group].state, "name", "UNKNOWN")
                        groups[group] = GroupState(group, state)

        metadata = admin.list_topics(timeout=timeout)
        partitions_of = {
            name: sorted(meta.partitions)
            for name, meta in metadata.topics.items()
            if not meta.error and not name.startswith("__")
        }
        every_tp = [(topic, p) for topic in sorted(partitions_of) for p in partitions_of[topic]]
        committed: dict[str, dict[tuple[str, int], int | None]] = {}
        for group in sorted(group_ids):
            if group not in listed and groups.get(group, GroupState(group)).state == "DEAD":
                committed[group] = {}  # no such group: nothing committed (and no request to make)
                continue
            try:
                committed[group] = {
                    tp: offset
                    for tp, offset in self._committed(group, every_tp).items()
                    if offset is not None
                }
            except Exception as exc:  # this group's offsets are unknown: its rows show ERR
                errors[group] = f"{type(exc).__name__}: {exc}"
                LAG_MONITOR_ERRORS.labels(stage="group_offsets").inc()
        for group in [g for g in self._group_consumers if g not in group_ids]:
            _close_quietly(self._group_consumers.pop(group))

        wanted: dict[str, set[str]] = {}
        for group, offsets in committed.items():
            for topic, _ in offsets:
                wanted.setdefault(group, set()).add(topic)
        for group, topic in rule_pairs:
            wanted.setdefault(group, set()).add(topic)
        tps = sorted(
            {
                (topic, p)
                for topics in wanted.values()
                for topic in topics
                if topic in partitions_of
                for p in partitions_of[topic]
            }
        )
        marks = self._watermarks(tps)
        rows: list[PartitionOffsets] = []
        for group in sorted(wanted):
            offsets = committed.get(group, {})
            for topic in sorted(wanted[group]):
                for partition in partitions_of.get(topic, []):
                    if (topic, partition) in marks:
                        low, high = marks[(topic, partition)]
                        committed_offset = offsets.get((topic, partition))
                        rows.append(PartitionOffsets(group, topic, partition, high, committed_offset, low))
        return LagSnapshot(taken_at, tuple(rows), groups, errors)

    def _watermarks(self, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """``(low, end)`` of each partition, probed at the tail when :attr:`probe` is on."""
        from confluent_kafka import TopicPartition

        consumer = self._watermark_consumer()
        timeout = self.config.request_timeout_s
        marks: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, partition in tps:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout, cached=False
                )
            except Exception as exc:  # a partition without a leader right now: skip it this round
                log.debug("watermarks of %s[%d] failed: %s", topic, partition, exc)
                continue
            marks[(topic, partition)] = (int(low), int(high))
        if self.probe:
            self._probe_tails(consumer, marks)
        return marks

    def _probe_tails(self, consumer: Any, marks: dict[tuple[str, int], tuple[int, int]]) -> None:
        """Fetch at ``end - 1`` once per partition; the fetch's high watermark is the true end."""
        from confluent_kafka import KafkaError, TopicPartition

        targets = [
            TopicPartition(topic, partition, max(high - 1, low))
            for (topic, partition), (low, high) in marks.items()
            if high > low
        ]
        if not targets:
            return
        pending = {(tp.topic, tp.partition) for tp in targets}
        seen: dict[tuple[str, int], int] = {}
        consumer.assign(targets)
        try:
            deadline = time.monotonic() + min(5.0, self.config.request_timeout_s)
            while pending and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=10_000, timeout=0.2):
                    key = (message.topic(), message.partition())
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            pending.discard(key)
                        continue
                    seen[key] = max(seen.get(key, -1), message.offset())
                    pending.discard(key)
            for key, (low, high) in list(marks.items()):
                try:
                    _, fetched_high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
                except Exception:  # no fetch response for this partition: keep what we have
                    fetched_high = -1
                end = max(high, int(fetched_high), seen.get(key, -1) + 1)
                marks[key] = (low, end)
        finally:
            consumer.unassign()


# ----------------------------------------------------------------------------- alerts


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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


# ----------------------------------------------------------------------------- the monitor


class LagMonitor:
    """Reader -> evaluator -> metrics and alert sinks; :meth:`tick` once per interval."""

    def __init__(
        self,
        settings: Settings,
        config: LagSettings | None = None,
        *,
        reader: OffsetReader | None = None,
        sinks: Sequence[AlertSink] | None = None,
        generator_url: str | None = None,
    ) -> None:
        self.settings = settings
        self.config = config if config is not None else LagSettings()
        self.reader = reader if reader is not None else OffsetReader(settings, self.config)
        self.evaluator = LagEvaluator(self.config)
        self.sinks: list[AlertSink] = list(sinks) if sinks is not None else default_sinks(settings)
        self.generator_url = generator_url
        self._exported: set[tuple[str, str, str]] = set()
        self._status_exported: set[tuple[str, str]] = set()

    @property
    def last_report(self) -> LagReport | None:
        """The latest report (``None`` before the first tick)."""
        return self.evaluator.last_report

    async def tick(self) -> LagReport:
        """Take a snapshot, evaluate it, export metrics and send alert events."""
        snapshot = await asyncio.to_thread(self.reader.snapshot)
        report = self.evaluator.observe(snapshot)
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


# ----------------------------------------------------------------------------- presentation


def format_lag_table(report: LagReport) -> str:
    """Plain-text table: group, topic, partition, end, committed, lag, status (then active alerts)."""
    header = ("group", "topic", "partition", "end", "committed", "lag", "status")
    rows: list[tuple[str, ...]] = []
    for topic in report.topics:
        if not topic.partitions:
            rows.append(
                (topic.group, topic.topic or "-", "-", "-", "-", "-", f"{topic.status} {topic.reason}")
            )
        for p in topic.partitions:
            o = p.offsets
            committed = "-" if o.committed is None else str(o.committed)
            rows.append((o.group, o.topic, str(o.partition), str(o.end), committed, str(o.lag), p.status))
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(7)]
    numeric = {2, 3, 4, 5}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(header)]
    out.extend(line(r) for r in rows)
    for group, message in sorted(report.errors.items()):
        out.append(f"error {group}: {message}")
    for state in report.active_alerts:
        out.append(
            f"ALERT {state.rule.name} [{state.rule.severity}] {state.group} {state.topic}: {state.reason}"
        )
        if state.rule.action:
            out.append(f"  -> {state.rule.action}")
    return "\n".join(out)


_COLOURS: dict[Status, str] = {
    "OK": "#1a7f37",
    "WARN": "#b08800",
    "STALL": "#d1242f",
    "STOP": "#8250df",
    "ERR": "#57606a",
}


def render_lag_html(report: LagReport | None, *, refresh_s: float = 5.0) -> str:
    """The ``GET /lag`` page: one row per partition, status in colour, active alerts on top."""
    e = html.escape
    head = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='{max(1, int(refresh_s))}'>"
        "<title>AVCC consumer lag</title><style>"
        "body{font-family:system-ui,sans-serif;margin:1.5rem}table{border-collapse:collapse}"
        "th,td{padding:.25rem .6rem;border-bottom:1px solid #ddd;text-align:left}"
        "td.n{text-align:right;font-variant-numeric:tabular-nums}"
        ".s{color:#fff;border-radius:3px;padding:0 .4rem;font-weight:600}"
        ".alert{background:#ffebe9;border:1px solid #d1242f;padding:.5rem;margin:.5rem 0}"
        "</style></head><body><h1>Consumer lag</h1>"
    )
    if report is None:
        return (
            head + "<p id='empty'>No snapshot yet; the monitor takes its first one shortly.</p></body></html>"
        )
    parts = [head, f"<p>Snapshot at <time>{e(_iso(report.taken_at))}</time></p>"]
    for state in report.active_alerts:
        parts.append(
            f"<div class='alert' data-rule='{e(state.rule.name)}'><b>{e(state.rule.name)}</b> "
            f"[{e(state.rule.severity)}] {e(state.group)} / {e(state.topic)}: {e(state.reason)}"
            f"<br>{e(state.rule.action)}</div>"
        )
    for group, message in sorted(report.errors.items()):
        parts.append(f"<div class='alert'>error {e(group)}: {e(message)}</div>")
    parts.append(
        "<table id='lag'><thead><tr><th>group</th><th>topic</th><th>partition</th><th>end</th>"
        "<th>committed</th><th>lag</th><th>status</th></tr></thead><tbody>"
    )
    for topic in report.topics:
        for p in topic.partitions:
            o = p.offsets
            committed = "-" if o.committed is None else str(o.committed)
            parts.append(
                f"<tr data-status='{p.status}'><td>{e(o.group)}</td><td>{e(o.topic)}</td>"
                f"<td class='n'>{o.partition}</td><td class='n'>{o.end}</td><td class='n'>{committed}</td>"
                f"<td class='n'>{o.lag}</td><td><span class='s' style='background:{_COLOURS[p.status]}' "
                f"title='{e(p.reason)}'>{p.status}</span></td></tr>"
            )
    parts.append("</tbody></table></body></html>")
    return "".join(parts)


def print_lag_table(settings: Settings, config: LagSettings | None = None) -> int:
    """``avcc lag``: one snapshot as a table on stdout.

    Exit status: 0 all fine, 1 a rule's threshold is exceeded or a group is STOPped,
    2 the broker could not be read. (One snapshot cannot show WARN/STALL: those need history;
    watch ``GET /lag`` of the ops worker for them.)
    """
    reader = OffsetReader(settings, config)
    try:
        snapshot = reader.snapshot()
    finally:
        reader.close()
    report = LagEvaluator(reader.config).observe(snapshot)
    print(format_lag_table(report))
    if BROKER_ERROR in report.errors:
        return 2
    if report.active_alerts or any(t.status in {"STOP", "ERR"} for t in report.topics):
        return 1
    return 0
