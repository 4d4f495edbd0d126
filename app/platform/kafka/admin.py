"""Applies the topic plan to a broker: creates missing topics, reports and fixes drift."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from app.platform.errors import DependencyUnavailable, TopicPlanDrift
from app.platform.kafka.clients import admin_client
from app.platform.settings import Settings
from app.platform.topics import TOPIC_PLAN, TopicSpec

__all__ = ["Drift", "PlanReport", "apply_plan", "describe_topics", "ensure_state_topic"]

log = logging.getLogger(__name__)

_TIMEOUT_S = 30.0
#: Tries of one topic creation that fails on its way (see :func:`_create_topics`).
_CREATE_ATTEMPTS = 4
_CREATE_RETRY_S = 1.0
_VISIBLE_WAIT_S = 15.0  # how long a created topic may take to show in every broker's answers
#: Errors of a create request that did not reach (or hear back from) the controller; librdkafka
#: does not flag them retriable. ``_DESTROY_BROKER``: seen creating the plan on a fresh 3-node
#: cluster, as the client replaced its bootstrap connection by the brokers it learned.
_TRANSIENT_CODES = frozenset(
    {
        KafkaError._DESTROY_BROKER,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.NOT_CONTROLLER,
        KafkaError.REQUEST_TIMED_OUT,
    }
)


@dataclass(frozen=True, slots=True)
class Drift:
    """One difference between the plan and the broker."""

    topic: str
    setting: str
    planned: str
    actual: str
    fixed: bool
    note: str = ""

    def line(self) -> str:
        """Human-readable one-liner."""
        state = "fixed" if self.fixed else "NOT FIXED"
        note = f" ({self.note})" if self.note else ""
        return f"{self.topic}: {self.setting} planned={self.planned} actual={self.actual} [{state}]{note}"


@dataclass(slots=True)
class PlanReport:
    """Outcome of :func:`apply_plan`."""

    created: list[str] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)

    @property
    def unfixed(self) -> list[Drift]:
        """Drift that is still there."""
        return [d for d in self.drift if not d.fixed]


def _admin(settings: Settings) -> AdminClient:
    return admin_client(settings)


def describe_topics(settings: Settings, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Partition count and the planned configs of each existing topic among ``names``."""
    admin = _admin(settings)
    metadata = admin.list_topics(timeout=_TIMEOUT_S)
    wanted = [n for n in names if n in metadata.topics]
    result: dict[str, dict[str, Any]] = {
        n: {"partitions": len(metadata.topics[n].partitions)} for n in wanted
    }
    if wanted:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in wanted]
        for resource, future in admin.describe_configs(resources).items():
            entries = future.result(timeout=_TIMEOUT_S)
            result[resource.name]["config"] = {k: v.value for k, v in entries.items()}
    return result


def _describe_settled(settings: Settings, names: list[str], deadline: float) -> dict[str, Any]:
    """:func:`describe_topics`, asked again while a broker lists a topic that the broker asked
    for its configs does not know yet (a topic just created elsewhere in a cluster)."""
    while True:
        try:
            return describe_topics(settings, names)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def _describe_when_visible(
    settings: Settings, names: list[str], wait_s: float = _VISIBLE_WAIT_S
) -> dict[str, Any]:
    """Describe topics that exist but may not be in the metadata yet (right after creation)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = _describe_settled(settings, names, deadline)
        if len(found) == len(names) or time.monotonic() > deadline:
            missing = sorted(set(names) - set(found))
            if missing:
                raise TopicPlanDrift(f"topics reported as existing but not visible in metadata: {missing}")
            return found
        time.sleep(0.5)


def _transient(error: KafkaError) -> bool:
    """A create request that failed on its way, not on its merits: worth sending again."""
    return bool(error.retriable()) or error.code() in _TRANSIENT_CODES


def _create_topics(
    admin: AdminClient, settings: Settings, specs: list[TopicSpec]
) -> tuple[list[str], list[str]]:
    """Create ``specs``; returns (created, already existing). A request lost on its way (a
    connection the client dropped as it learned the cluster's brokers, a controller moving) is
    sent again, up to :data:`_CREATE_ATTEMPTS` times; a topic it did create meanwhile then
    answers "already exists" and is verified by the caller."""
    created: list[str] = []
    raced: list[str] = []
    pending = list(specs)
    for attempt in range(1, _CREATE_ATTEMPTS + 1):
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=settings.replication_factor,
                    config=s.broker_config(),
                )
                for s in pending
            ],
            operation_timeout=_TIMEOUT_S,
        )
        by_name = {s.name: s for s in pending}
        pending = []
        failure: KafkaException | None = None
        for name, future in futures.items():
            try:
                future.result(timeout=_TIMEOUT_S)
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    raced.append(name)  # created meanwhile, or metadata lagged: verified later
                elif _transient(error) and attempt < _CREATE_ATTEMPTS:
                    pending.append(by_name[name])
                    failure = exc
                else:
                    raise
            else:
                created.append(name)
        if not pending:
            break
        log.warning(
            "creating %d topic(s) failed on the way (%s); sending again (attempt %d of %d)",
            len(pending),
            failure.args[0].str() if failure else "?",
            attempt + 1,
            _CREATE_ATTEMPTS,
        )
        time.sleep(_CREATE_RETRY_S)
    return created, raced


def apply_plan(
    settings: Settings,
    plan: Iterable[TopicSpec] = TOPIC_PLAN,
    *,
    grow_partitions: bool = False,
    fix_config: bool = True,
) -> PlanReport:
    """Create missing topics and verify existing ones against ``plan``.

    Retention/cleanup drift is corrected (it is safe); a partition count below the plan is grown
    only with ``grow_partitions`` (keys remap to other partitions, breaking per-record order for
    in-flight records); a count above the plan can never be fixed.
    """
    specs = list(plan)
    admin = _admin(settings)
    report = PlanReport()
    existing = _describe_settled(settings, [s.name for s in specs], time.monotonic() + _VISIBLE_WAIT_S)

    missing = [s for s in specs if s.name not in existing]
    if missing:
        created, raced = _create_topics(admin, settings, missing)
        report.created.extend(created)
        if created:  # returned once the broker's metadata lists them, so callers can use them
            _describe_when_visible(settings, created)
        if raced:
            existing.update(_describe_when_visible(settings, raced))

    for spec in specs:
        if spec.name not in existing:
            continue
        report.drift.extend(_check_topic(admin, spec, existing[spec.name], grow_partitions, fix_config))
    return report


def _fix_config(admin: AdminClient, topic: str, wrong: dict[str, str]) -> None:
    """Set the drifted configs of ``topic`` (only those: an operator's other overrides stay) and
    return once the broker describes them so. A KRaft broker answers DescribeConfigs from its
    metadata image, which takes the acknowledged change a moment later: under a CPU hog, a
    ``topics apply`` right after one that had fixed a retention reported the same drift again."""
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in wrong.items()]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=_TIMEOUT_S)
    deadline = time.monotonic() + _VISIBLE_WAIT_S
    while True:
        described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
        config = {k: e.value for k, e in next(iter(described.values())).result(timeout=_TIMEOUT_S).items()}
        stale = sorted(k for k, v in wrong.items() if config.get(k) != v)
        if not stale:
            return
        if time.monotonic() > deadline:
            raise TopicPlanDrift(
                f"{topic}: {', '.join(stale)} set, but the broker still describes the old value "
                f"{_VISIBLE_WAIT_S:.0f} s later"
            )
        time.sleep(0.2)


def _check_topic(
    admin: AdminClient,
    spec: TopicSpec,
    actual: dict[str, Any],
    grow_partitions: bool,
    fix_config: bool,
) -> list[Drift]:
    drift: list[Drift] = []
    partitions = int(actual["partitions"])
    if partitions < spec.partitions:
        note = "growing remaps keys: in-flight records may be processed out of order"
        if grow_partitions:
            log.warning("%s: growing partitions %d -> %d; %s", spec.name, partitions, spec.partitions, note)
            futures = admin.create_partitions([NewPartitions(spec.name, spec.partitions)])
            for future in futures.values():
                future.result(timeout=_TIMEOUT_S)
        drift.append(
            Drift(spec.name, "partitions", str(spec.partitions), str(partitions), grow_partitions, note)
        )
    elif partitions > spec.partitions:
        drift.append(
            Drift(
                spec.name,
                "partitions",
                str(spec.partitions),
                str(partitions),
                False,
                "Kafka cannot shrink partitions; recreate the topic or change the plan",
            )
        )

    config: dict[str, str] = actual.get("config", {})
    wrong = {k: v for k, v in spec.broker_config().items() if config.get(k) != v}
    if wrong:
        if fix_config:
            _fix_config(admin, spec.name, wrong)
        for key, planned in wrong.items():
            drift.append(Drift(spec.name, key, planned, str(config.get(key)), fix_config))
    return drift


def ensure_state_topic(settings: Settings, spec: TopicSpec) -> bool:
    """Create a topic a group keeps its own state in (a changelog, an internal stream) as ``spec``
    lays it out, through the plan (:func:`apply_plan`), and return once every partition has a
    leader; whether it was created.

    The topic of a worker embedded elsewhere (tests, the benches) is created this way; a worker
    started by ``avcc worker`` finds it made. An existing topic with another partition count is
    refused (:class:`TopicPlanDrift`): states are addressed by partition number. Blocks on the
    broker: call it from a thread.
    """
    report = apply_plan(settings, [spec])
    resized = [drift for drift in report.unfixed if drift.setting == "partitions"]
    if resized:
        raise TopicPlanDrift(
            f"{spec.name} has {resized[0].actual} partitions, the plan {spec.partitions}: delete it (it is "
            "rebuilt from the next snapshots) or fix the plan"
        )
    _wait_until_led(_admin(settings), spec.name, spec.partitions)
    if spec.name in report.created:
        log.info("created %s topic %s (%d partitions)", spec.cleanup_policy, spec.name, spec.partitions)
    return spec.name in report.created


def _wait_until_led(admin: AdminClient, topic: str, partitions: int) -> None:
    """Return once the broker's metadata shows ``topic`` with every partition led.

    A topic just created reaches the brokers' metadata a little later (KRaft propagates it), and
    a consumer that subscribes before then is told the topic does not exist and looks again only
    at its next metadata refresh, minutes later: the anomaly detector's second stage sat idle.
    """
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        found = admin.list_topics(topic=topic, timeout=_TIMEOUT_S).topics.get(topic)
        if (
            found is not None
            and found.error is None
            and len(found.partitions) == partitions
            and all(p.leader >= 0 for p in found.partitions.values())
        ):
            return
        if time.monotonic() > deadline:
            raise DependencyUnavailable(f"{topic} was created but its partitions have no leader yet")
        time.sleep(0.1)
