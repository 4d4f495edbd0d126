"""Prometheus metrics of every worker (one registry per process, served on ``/metrics``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "ANOMALIES",
    "CH_BATCH_ROWS",
    "CH_INSERT_FAILURES",
    "CH_INSERT_SECONDS",
    "CONSUMER_LAG",
    "DEDUP_HITS",
    "DLQ_MESSAGES",
    "EVENTS_IN",
    "EVENTS_OUT",
    "EVENT_AGE",
    "HTTP_REQUESTS",
    "INGEST_ITEMS",
    "LAG_ALERTS",
    "PROCESSING_SECONDS",
    "REGISTRY",
    "RETRIES",
    "RETRY_TOPIC_MESSAGES",
]

REGISTRY = CollectorRegistry(auto_describe=True)

EVENTS_IN = Counter("avcc_events_consumed_total", "Events consumed", ["group", "topic"], registry=REGISTRY)
EVENTS_OUT = Counter("avcc_events_produced_total", "Events produced", ["group", "topic"], registry=REGISTRY)
PROCESSING_SECONDS = Histogram(
    "avcc_event_processing_seconds",
    "Time to process one event (or one batch on the playback path)",
    ["group", "topic"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
EVENT_AGE = Histogram(
    "avcc_event_age_seconds",
    "End-to-end age of an event when processed (now - envelope timestamp)",
    ["group", "topic"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
    registry=REGISTRY,
)
DEDUP_HITS = Counter(
    "avcc_dedup_hits_total",
    "Duplicate deliveries skipped by event_id",
    ["group", "topic"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "avcc_retries_total",
    "In-process retries after retriable failures",
    ["group", "topic"],
    registry=REGISTRY,
)
RETRY_TOPIC_MESSAGES = Counter(
    "avcc_retry_topic_messages_total",
    "Messages forwarded to the retry topic",
    ["group", "topic", "reason"],
    registry=REGISTRY,
)
DLQ_MESSAGES = Counter(
    "avcc_dlq_messages_total",
    "Messages dead-lettered",
    ["group", "topic", "error_class"],
    registry=REGISTRY,
)
CH_BATCH_ROWS = Histogram(
    "avcc_clickhouse_batch_rows",
    "Rows per ClickHouse insert",
    ["table"],
    buckets=(1, 10, 100, 1000, 5000, 10000, 25000, 50000, 100000),
    registry=REGISTRY,
)
CH_INSERT_SECONDS = Histogram(
    "avcc_clickhouse_insert_seconds", "ClickHouse insert latency", ["table"], registry=REGISTRY
)
CH_INSERT_FAILURES = Counter(
    "avcc_clickhouse_insert_failures_total",
    "Failed ClickHouse inserts",
    ["table"],
    registry=REGISTRY,
)
HTTP_REQUESTS = Counter(
    "avcc_http_requests_total", "HTTP requests", ["route", "method", "status"], registry=REGISTRY
)
INGEST_ITEMS = Counter(
    "avcc_ingest_items_total",
    "Playback items received by the gateway",
    ["outcome"],
    registry=REGISTRY,
)
ANOMALIES = Counter(
    "avcc_anomalies_total", "Anomalies detected on the playback stream", ["rule"], registry=REGISTRY
)
CONSUMER_LAG = Gauge(
    "avcc_consumer_lag_messages",
    "Consumer lag (end offset - committed offset)",
    ["group", "topic", "partition"],
    registry=REGISTRY,
)
LAG_ALERTS = Gauge(
    "avcc_lag_alert_active",
    "1 while a lag rule fires",
    ["rule", "group", "topic"],
    registry=REGISTRY,
)

# --- HMAC auth, gateway and anomaly detector (appended) ---------------------------------------
AUTH_FAILURES = Counter(
    "avcc_auth_failures_total", "Refused /v1/ requests by reason", ["reason"], registry=REGISTRY
)
ANOMALY_LATE_EVENTS = Counter(
    "avcc_anomaly_late_events_total",
    "Playback events dropped by the anomaly detector because their window had already closed",
    registry=REGISTRY,
)
ANOMALY_SKIPPED_EVENTS = Counter(
    "avcc_anomaly_skipped_events_total",
    "Playback events the anomaly detector could not read (undecodable, missing fields, far future)",
    ["reason"],
    registry=REGISTRY,
)
ANOMALY_WATERMARK = Gauge(
    "avcc_anomaly_watermark_ms",
    "Event-time watermark of the anomaly detector (epoch ms)",
    registry=REGISTRY,
)
ANOMALY_OPEN_WINDOWS = Gauge(
    "avcc_anomaly_open_windows",
    "Open (not yet evaluated) windows over all owned partitions",
    registry=REGISTRY,
)
ANOMALY_CHECKPOINT_SECONDS = Histogram(
    "avcc_anomaly_checkpoint_seconds",
    "Time to write window snapshots to the changelog and commit offsets",
    registry=REGISTRY,
)
__all__ += [
    "ANOMALY_CHECKPOINT_SECONDS",
    "ANOMALY_LATE_EVENTS",
    "ANOMALY_OPEN_WINDOWS",
    "ANOMALY_SKIPPED_EVENTS",
    "ANOMALY_WATERMARK",
    "AUTH_FAILURES",
]

# --- retry consumer, DLQ index and alerts (app/ops/retry/, app/ops/dlq/, app/ops/alerts.py) ---
RETRY_REDELIVERED = Counter(
    "avcc_retry_redelivered_total",
    "Retry-topic messages re-produced to their original topic",
    ["target_group", "topic"],
    registry=REGISTRY,
)
RETRY_REDELIVERY_LATENESS = Histogram(
    "avcc_retry_redelivery_lateness_seconds",
    "Redelivery time minus the message's not-before time",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
RETRY_WAITING_PARTITIONS = Gauge(
    "avcc_retry_waiting_partitions",
    "Retry-topic partitions paused until their head message is due",
    registry=REGISTRY,
)
DLQ_INDEXED = Counter(
    "avcc_dlq_indexed_total",
    "Dead letters indexed by the ops DLQ store (new arrivals)",
    ["group", "topic", "error_class"],
    registry=REGISTRY,
)
DLQ_STORED = Gauge(
    "avcc_dlq_stored_messages",
    "Dead letters in the DLQ store by status",
    ["status"],
    registry=REGISTRY,
)
DLQ_ACTIONS = Counter(
    "avcc_dlq_actions_total",
    "Operator actions on dead letters",
    ["action", "outcome"],
    registry=REGISTRY,
)
ALERTS_SENT = Counter(
    "avcc_alerts_sent_total",
    "Alerts sent to the alert sinks",
    ["alertname"],
    registry=REGISTRY,
)
ALERTS_SUPPRESSED = Counter(
    "avcc_alerts_suppressed_total",
    "Alerts merged into an earlier one within the dedup window",
    ["alertname"],
    registry=REGISTRY,
)

__all__ += [
    "ALERTS_SENT",
    "ALERTS_SUPPRESSED",
    "DLQ_ACTIONS",
    "DLQ_INDEXED",
    "DLQ_STORED",
    "RETRY_REDELIVERED",
    "RETRY_REDELIVERY_LATENESS",
    "RETRY_WAITING_PARTITIONS",
]

# --- lag monitor (app/lag.py) ---------------------------------------------------------------
LAG_STATUS = Gauge(
    "avcc_consumer_lag_status",
    "Burrow-style status of a group on a topic: 0 OK, 1 WARN, 2 STALL, 3 STOP, 4 ERR",
    ["group", "topic"],
    registry=REGISTRY,
)
LAG_MONITOR_ERRORS = Counter(
    "avcc_lag_monitor_errors_total",
    "Failures of the lag monitor (snapshot, group offsets, webhook)",
    ["stage"],
    registry=REGISTRY,
)
__all__ += ["LAG_MONITOR_ERRORS", "LAG_STATUS"]
# --- clickhouse-sink (agents/sink.py) ---
SINK_ROWS_WRITTEN = Counter(
    "avcc_sink_rows_written_total",
    "Rows inserted by the sink (after dropping in-batch duplicate event ids)",
    ["table"],
    registry=REGISTRY,
)
SINK_PAUSED = Gauge(
    "avcc_sink_paused",
    "1 while the sink holds a batch it cannot store and has paused its partitions",
    ["group"],
    registry=REGISTRY,
)
SINK_PENDING_MESSAGES = Gauge(
    "avcc_sink_pending_messages",
    "Messages consumed but not yet stored and committed (the in-memory batch)",
    ["group"],
    registry=REGISTRY,
)
SINK_DROPPED_ON_REVOKE = Counter(
    "avcc_sink_uncommitted_dropped_total",
    "Uncommitted messages dropped on a rebalance (redelivered to the new owner)",
    ["group"],
    registry=REGISTRY,
)
SINK_COMMIT_FAILURES = Counter(
    "avcc_sink_commit_failures_total",
    "Offset commits that failed after a stored batch (the batch is redelivered and deduplicated)",
    ["group"],
    registry=REGISTRY,
)
__all__ += [
    "SINK_COMMIT_FAILURES",
    "SINK_DROPPED_ON_REVOKE",
    "SINK_PAUSED",
    "SINK_PENDING_MESSAGES",
    "SINK_ROWS_WRITTEN",
]

# --- operator pages (appended) -------------------------------------------------------------------
OPERATOR_LOGIN_FAILURES = Counter(
    "avcc_operator_login_failures_total",
    "Refused operator logins (Basic auth of the console and operator pages) by reason",
    ["reason"],
    registry=REGISTRY,
)
__all__ += ["OPERATOR_LOGIN_FAILURES"]

# --- faust replies (app/platform/faust/app.py) -----------------------------------------------------
OFFSET_DECISIONS = Counter(
    "avcc_consumer_offset_decisions_total",
    "Messages of a core group's input not processed in line, by decision: redelivered (below the "
    "next offset: processed already), sought_back (past it: the partition is fetched again), "
    "not_assigned, tail_sought (nothing arrived while the partition's end stayed past it), "
    "lost_to_retention (offsets deleted before they were processed)",
    ["agent", "topic", "decision"],
    registry=REGISTRY,
)
__all__ += ["OFFSET_DECISIONS"]
STAGE_SECONDS = Histogram(
    "avcc_request_stage_seconds",
    "Time a signed request spent in each stage that waits on the broker: nonce (its nonce claimed "
    "and read back), claim (the claims agent answered an application)",
    ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
__all__ += ["STAGE_SECONDS"]
BATCH_EVENTS = Histogram(
    "avcc_batch_events",
    "Events a core agent processed per batch (one produce, one wait for acks, one commit each)",
    ["agent"],
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
    registry=REGISTRY,
)
__all__ += ["BATCH_EVENTS"]
BATCH_SECONDS = Histogram(
    "avcc_batch_seconds",
    "Time a core agent took to make one batch durable and commit it",
    ["agent"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
__all__ += ["BATCH_SECONDS"]
BATCH_FAILURES = Counter(
    "avcc_batch_failures_total",
    "Batches whose outputs or table writes could not be made durable (sent again with backoff)",
    ["agent"],
    registry=REGISTRY,
)
__all__ += ["BATCH_FAILURES"]
COMMIT_FAILURES = Counter(
    "avcc_commit_failures_total",
    "Offset commits of a core agent that failed: rebalanced (a new owner replays the batch; the "
    "event-id dedup absorbs it) or unavailable (committed with the next batch)",
    ["agent", "reason"],
    registry=REGISTRY,
)
__all__ += ["COMMIT_FAILURES"]
PRODUCER_DELIVERY_FAILURES = Counter(
    "avcc_producer_delivery_failures_total",
    "Messages of an unacknowledged producer profile (playback) the broker never stored",
    ["profile", "topic"],
    registry=REGISTRY,
)
__all__ += ["PRODUCER_DELIVERY_FAILURES"]


class ReadGauge(Collector):
    """A gauge read from its worker when scraped (:attr:`source`, set by the worker that knows the
    value); no sample while the source has none, so a rule's ``min()`` over replicas skips it."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.source: Callable[[], float | None] = lambda: None
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """The family, with its one sample when the source has a value."""
        family = GaugeMetricFamily(self.name, self.documentation)
        value = self.source()
        if value is not None:
            family.add_metric([], value)
        yield family


# --- time to code (app/lifecycle/code/time_to_code.py; the SLOs of app/ops/slo/) ---------------
#: Upper bounds (s) of the time-to-code histograms: tenths of a second on the fast path (O-level
#: codes take about 0.3 s), then seconds up to 5 minutes. A service level's target is one of them.
TIME_TO_CODE_BUCKETS: Final = (
    *(0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0),
    *(15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0, 300.0),
)
#: Label ``review`` of :data:`TIME_TO_CODE`: no person decided (the AI review's answer stood), or one did.
REVIEW_AI: Final = "ai"
REVIEW_HUMAN: Final = "human"
#: Label ``stage`` of :data:`TIME_TO_CODE_STAGE`, in the order a record goes through them: ``code``
#: (the accepted application reaching its record), ``review`` (the AI review's answer reaching
#: the record), ``human_wait`` (waiting for a person's decision), ``chain`` (the approved work
#: waiting for its chain receipt).
TIME_TO_CODE_STAGES: Final = ("code", "review", "human_wait", "chain")
TIME_TO_CODE = Histogram(
    "avcc_time_to_code_seconds",
    "Time from an application's acceptance to its final answer, observed once per record: level "
    "(its final_level), outcome (issued, rejected, chain_failed), review (ai: no person decided; human)",
    ["level", "outcome", "review"],
    buckets=TIME_TO_CODE_BUCKETS,
    registry=REGISTRY,
)
TIME_TO_CODE_STAGE = Histogram(
    "avcc_time_to_code_stage_seconds",
    "Time a record spent in each stage (code, review, human_wait, chain) of its time to code, "
    "observed with it",
    ["level", "stage"],
    buckets=TIME_TO_CODE_BUCKETS,
    registry=REGISTRY,
)
NEED_HUMAN_OLDEST = ReadGauge(
    "avcc_need_human_oldest_since_seconds",
    "Since when (unix time) the longest-waiting need_human record of this code worker's record "
    "partitions has waited for a person; no sample while none waits",
    REGISTRY,
)
__all__ += [
    "NEED_HUMAN_OLDEST",
    "REVIEW_AI",
    "REVIEW_HUMAN",
    "TIME_TO_CODE",
    "TIME_TO_CODE_BUCKETS",
    "TIME_TO_CODE_STAGE",
    "TIME_TO_CODE_STAGES",
    "ReadGauge",
]
