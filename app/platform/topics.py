"""Topic plan: the one source of truth for every topic's name, layout, retention, key and profile.

Agents, producers, the admin command and the deploy manifests all read this module; no other
module spells the name of a topic of the plan. Topics that follow from the agent groups (table
changelogs, faust reply topics) are named by faust or by :func:`reply_topic` and listed by
:mod:`app.platform.internal_topics`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = [
    "ANOMALY",
    "ANOMALY_MERGE_CHANGELOG",
    "ANOMALY_SNAPSHOT_MAX_BYTES",
    "ANOMALY_WINDOW_CHANGELOG",
    "ANOMALY_WINDOW_PARTIALS",
    "APPLY_CREATED",
    "CHAIN_TX_CONFIRMED",
    "CHAIN_TX_PENDING",
    "CODE_CLAIMS",
    "CODE_REVIEW_FINISHED",
    "COMPACTION",
    "DAY_MS",
    "DLQ",
    "DLQ_STATE",
    "HOUR_MS",
    "INFINITE",
    "NONCES",
    "PLAYBACK_EVENT",
    "RETRY",
    "REVIEW_DECISIONS",
    "REVIEW_TASK_FINISHED",
    "TOPIC_PLAN",
    "ProducerProfile",
    "TopicSpec",
    "reply_topic",
    "spec_for",
]

ProducerProfile = Literal["core", "playback"]
CleanupPolicy = Literal["delete", "compact"]

HOUR_MS = 60 * 60 * 1000
DAY_MS = 24 * HOUR_MS
#: Kafka's spelling of "keep forever".
INFINITE = -1

#: Configs of every compacted state topic (table changelogs, detector snapshots), so a replay
#: reads about one version of each key: Kafka never compacts a partition's active segment, so it
#: rolls at least hourly (by default only at 1 GiB, holding every version written meanwhile); the
#: cleaner starts once a tenth of a log is dirty (by default a half: a replay could read two
#: versions a key); deletions (tombstones) are kept a day, far longer than any restore takes, so a
#: restore always sees them.
COMPACTION: Mapping[str, str] = {
    "segment.ms": str(HOUR_MS),
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": str(DAY_MS),
}


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic of the plan."""

    name: str
    partitions: int
    retention_ms: int
    cleanup_policy: CleanupPolicy
    key_field: str
    profile: ProducerProfile
    purpose: str
    replication_factor: int = 1
    #: The largest record the topic accepts (``max.message.bytes``); ``None``: the broker's default.
    max_message_bytes: int | None = None

    @property
    def retention_days(self) -> float | None:
        """Retention in days, ``None`` for infinite."""
        return None if self.retention_ms == INFINITE else self.retention_ms / DAY_MS

    def broker_config(self) -> dict[str, str]:
        """Topic-level configs applied on creation and checked for drift (a compacted topic's
        :data:`COMPACTION` included)."""
        config = {"retention.ms": str(self.retention_ms), "cleanup.policy": self.cleanup_policy}
        if self.cleanup_policy == "compact":
            config.update(COMPACTION)
        if self.max_message_bytes is not None:
            config["max.message.bytes"] = str(self.max_message_bytes)
        return config

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready description with the broker configs (used by ``avcc topics plan --json``)."""
        return {**asdict(self), "config": self.broker_config()}


APPLY_CREATED = TopicSpec(
    name="topic.avcc.apply.created",
    partitions=6,
    retention_ms=7 * DAY_MS,
    cleanup_policy="delete",
    key_field="avcc_record_id",
    profile="core",
    purpose="application passed pre-check (code-svc -> review-svc)",
)
REVIEW_TASK_FINISHED = TopicSpec(
    name="topic.review.task.finished",
    partitions=12,
    retention_ms=7 * DAY_MS,
    cleanup_policy="delete",
    key_field="avcc_record_id",
    profile="core",
    purpose="AI/human review result (review-svc -> chain-svc, code-svc)",
)
CHAIN_TX_PENDING = TopicSpec(
    name="topic.chain.tx.pending",
    partitions=6,
    retention_ms=7 * DAY_MS,
    cleanup_policy="delete",
    key_field="avcc_record_id",
    profile="core",
    purpose="transaction to put on chain: evidence notarisation, settlement instructions",
)
CHAIN_TX_CONFIRMED = TopicSpec(
    name="topic.chain.tx.confirmed",
    partitions=6,
    retention_ms=30 * DAY_MS,
    cleanup_policy="delete",
    key_field="avcc_record_id",
    profile="core",
    purpose="on-chain receipt (chain-svc -> code-svc, settlement-svc)",
)
PLAYBACK_EVENT = TopicSpec(
    name="topic.playback.event",
    partitions=24,
    retention_ms=3 * DAY_MS,
    cleanup_policy="delete",
    key_field="event_id",
    profile="playback",
    purpose="partner playback firehose (gateway-svc -> clickhouse-sink, anomaly)",
)
DLQ = TopicSpec(
    name="topic.system.dlq",
    partitions=3,
    retention_ms=INFINITE,
    cleanup_policy="delete",
    key_field="original key",
    profile="core",
    purpose="dead letters of every consumer, kept until an operator handles them",
)
#: Operator state of the dead letters (status, audit trail, re-injection counts and claims), as a
#: log of versioned changes keyed by ``group|event id`` (:mod:`app.ops.dlq.state`). Every ops
#: replica reads it from the beginning into its local store, so a lost disk is rebuilt and all
#: replicas serve one view. Kept whole (``delete``, infinite retention) rather than compacted:
#: compaction keeps the *last* record of a key, which after two concurrent actions can be the one
#: the version check refused; the volume is one record per operator action. Not in TOPIC_PLAN (no
#: envelope contract, only the ops group reads or writes it): :mod:`app.platform.internal_topics`
#: lists it with the ops group's internal topics.
DLQ_STATE = TopicSpec(
    name="topic.system.dlq.state",
    partitions=3,
    retention_ms=INFINITE,
    cleanup_policy="delete",
    key_field="consumer group | event id",
    profile="core",
    purpose="operator actions on dead letters (status, audit trail, re-injections), shared by ops replicas",
)
#: Retry topic: 6 partitions because it carries the core topics' keys at their own partition
#: count (a record's retried events stay in one partition, in order), and its volume is a small
#: fraction of the core flow. 7 days, like the core topics: a parked event must never expire
#: before the events it was retried for.
RETRY = TopicSpec(
    name="topic.system.retry",
    partitions=6,
    retention_ms=7 * DAY_MS,
    cleanup_policy="delete",
    key_field="original key",
    profile="core",
    purpose="messages whose in-process retries failed, redelivered by the retry consumer",
)
#: Anomalies found by the windowed detector (replaces the Flink job's output).
ANOMALY = TopicSpec(
    name="topic.playback.anomaly",
    partitions=6,
    retention_ms=30 * DAY_MS,
    cleanup_policy="delete",
    key_field="avcc_code",
    profile="core",
    purpose="anomalies detected on the playback stream, with their evidence",
)
#: The largest record of the anomaly detector's topics: snapshots can be big (the open windows of
#: a busy partition).
ANOMALY_SNAPSHOT_MAX_BYTES = 16 * 1024 * 1024
#: Snapshots of the anomaly detector's open windows, one partition per playback partition (key =
#: the partition number). Not in TOPIC_PLAN: the detector creates it when it starts
#: (:func:`app.platform.kafka.admin.ensure_state_topic`), like its two other topics.
ANOMALY_WINDOW_CHANGELOG = TopicSpec(
    name="avcc-anomaly-window-changelog",
    partitions=PLAYBACK_EVENT.partitions,
    retention_ms=INFINITE,
    cleanup_policy="compact",
    key_field="source partition number",
    profile="core",
    purpose="window snapshots of the anomaly detector (its state's changelog)",
    max_message_bytes=ANOMALY_SNAPSHOT_MAX_BYTES,
)
#: Stage 1 -> stage 2 of the anomaly detector: each source partition's closed windows, split by
#: ``crc32(avcc_code) mod partitions`` so every code's counts from all 24 source partitions meet
#: in one partition, plus each source partition's progress marker (``app.playback.anomaly.partials``).
#: Records are per window and source partition (24 x 12 per window); stage 2 consumes them
#: within seconds, and they are kept as long as the events they summarise. Not in TOPIC_PLAN: the
#: detector creates it like its changelog (the group's internal state, raw JSON, not envelopes).
ANOMALY_WINDOW_PARTIALS = TopicSpec(
    name="avcc-anomaly-window-partials",
    partitions=12,
    retention_ms=PLAYBACK_EVENT.retention_ms,
    cleanup_policy="delete",
    key_field="source partition number (partition = avcc_code bucket)",
    profile="core",
    purpose="partial window aggregates of the anomaly detector (stage 1 -> stage 2)",
    max_message_bytes=ANOMALY_SNAPSHOT_MAX_BYTES,
)
#: Snapshots of stage 2 (merged windows awaiting completeness, marks, baselines), one partition
#: per partials partition (key = that partition number). Not in TOPIC_PLAN, like the other.
ANOMALY_MERGE_CHANGELOG = TopicSpec(
    name="avcc-anomaly-merge-changelog",
    partitions=ANOMALY_WINDOW_PARTIALS.partitions,
    retention_ms=INFINITE,
    cleanup_policy="compact",
    key_field="partials partition number",
    profile="core",
    purpose="stage-2 snapshots of the anomaly detector (merged windows and baselines)",
    max_message_bytes=ANOMALY_SNAPSHOT_MAX_BYTES,
)

#: Internal topics of the code and review groups. Each is keyed like the table it feeds and has
#: the partition count of the group's other inputs, so every table stays co-partitioned.
CODE_CLAIMS = TopicSpec(
    name="topic.internal.code.claims",
    partitions=6,
    retention_ms=1 * DAY_MS,
    cleanup_policy="delete",
    key_field="content_hash",
    profile="core",
    purpose="application claims (one work, one record): HTTP apply -> claims agent (faust ask)",
)
CODE_REVIEW_FINISHED = TopicSpec(
    name="topic.internal.code.review-finished",
    partitions=6,
    retention_ms=7 * DAY_MS,
    cleanup_policy="delete",
    key_field="avcc_record_id",
    profile="core",
    purpose="review.task.finished (12 partitions) repartitioned to the code group's 6",
)
REVIEW_DECISIONS = TopicSpec(
    name="topic.internal.review.decision",
    partitions=6,
    retention_ms=7 * DAY_MS,
    cleanup_policy="delete",
    key_field="avcc_record_id",
    profile="core",
    purpose="human reviewer decisions, co-partitioned with apply.created for the tasks table",
)

#: Nonces of signed HTTP requests, shared by every replica of every group: a request's claim is
#: keyed by its key id and nonce, so all claims of one nonce meet in one partition, where the
#: first in log order wins (:mod:`app.platform.http.nonces`). Kept well past the 2 x skew window.
NONCES = TopicSpec(
    name="topic.system.nonces",
    partitions=6,
    retention_ms=60 * 60 * 1000,
    cleanup_policy="delete",
    key_field="key id + nonce",
    profile="core",
    purpose="nonces of signed /v1/ requests: a request is accepted once in the whole deployment",
)

#: The seed's six topics, the retry topic, then topics this project adds.
TOPIC_PLAN: tuple[TopicSpec, ...] = (
    APPLY_CREATED,
    REVIEW_TASK_FINISHED,
    CHAIN_TX_PENDING,
    CHAIN_TX_CONFIRMED,
    PLAYBACK_EVENT,
    DLQ,
    RETRY,
    ANOMALY,
    CODE_CLAIMS,
    CODE_REVIEW_FINISHED,
    REVIEW_DECISIONS,
    NONCES,
)


def spec_for(name: str) -> TopicSpec:
    """The plan entry of topic ``name``; ``KeyError`` if the plan has no such topic."""
    for spec in TOPIC_PLAN:
        if spec.name == name:
            return spec
    raise KeyError(name)


def reply_topic(group: str) -> str:
    """The stable faust reply topic shared by the workers of ``group`` (groups that never ask)."""
    return f"avcc-{group}-replies"
