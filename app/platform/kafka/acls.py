"""Least-privilege Kafka ACLs of every agent group, generated from the topic plan and the flows.

Each group runs as its own principal, ``User:avcc-<group>`` (its SASL user name is its consumer
group id, :func:`~app.platform.faust.app.consumer_group_id`). Its grants follow from data the
pipeline already keeps, so a topic added to the plan gets its grants from its flow or not at all:

* a topic of the plan: ``WRITE`` for the groups that produce or redeliver it, ``READ`` for the
  groups that consume it (:data:`~app.platform.flows.TOPIC_FLOWS`), ``DESCRIBE`` for both; a
  group that checks the topic at start (:func:`~app.platform.internal_topics.worker_topics`)
  may also read its configuration;
* the group's own internal topics (table changelogs, its reply topic, the anomaly detector's
  state), all named ``avcc-<group>-…``: everything a worker needs to create, check and use them,
  on that prefix only;
* the group's other state topics (:data:`~app.platform.internal_topics.STATE_TOPICS`): the same,
  on each name;
* consumer groups named ``avcc-<group>…`` (the group itself, the DLQ console's, the anomaly
  restore's), plus the reader groups shared by name (:func:`shared_reader_groups`);
* the ops group, which shows every group's lag: ``DESCRIBE`` of every consumer group and topic of
  the pipeline, nothing more.

``avcc kafka acls plan`` prints them; ``avcc kafka acls apply`` creates them as the broker's
administrator (a super user).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

from app.platform.faust.app import consumer_group_id
from app.platform.flows import TOPIC_FLOWS
from app.platform.groups import GROUPS, GroupSpec
from app.platform.http.nonces import NONCE_READER_GROUP
from app.platform.internal_topics import STATE_TOPICS
from app.platform.lag.reader import LAG_READER_GROUP
from app.platform.topics import NONCES, TOPIC_PLAN

__all__ = [
    "AclGrant",
    "acl_plan",
    "group_principal",
    "internal_prefix",
    "shared_reader_groups",
]

ResourceType = Literal["TOPIC", "GROUP"]
PatternType = Literal["LITERAL", "PREFIXED"]
Operation = Literal["READ", "WRITE", "DESCRIBE", "CREATE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"]

#: Everything a worker does to the internal topics it owns: create them at start, check and fix
#: their configuration (:func:`~app.platform.kafka.admin.apply_plan`), read and write them.
_OWNED: Final[tuple[Operation, ...]] = (
    "CREATE",
    "DESCRIBE",
    "DESCRIBE_CONFIGS",
    "ALTER_CONFIGS",
    "READ",
    "WRITE",
)


def shared_reader_groups() -> dict[str, tuple[str, ...]]:
    """Reader groups shared by name across groups, with the groups that use each: the nonce
    ledger's reader (every group with signed routes) and the lag reader (ops). Both only assign
    partitions and never commit; the group id only satisfies the client."""
    return {
        NONCE_READER_GROUP: tuple(g.name for g in GROUPS if g.signed_routes),
        LAG_READER_GROUP: ("ops",),
    }


@dataclass(frozen=True, order=True, slots=True)
class AclGrant:
    """One ``ALLOW`` ACL: ``principal`` may ``operation`` on a resource, from any host."""

    principal: str
    resource_type: ResourceType
    pattern_type: PatternType
    resource_name: str
    operation: Operation

    def line(self) -> str:
        """One line of ``avcc kafka acls plan``."""
        return (
            f"{self.principal:24} {self.operation:16} {self.resource_type:5} "
            f"{self.pattern_type:8} {self.resource_name}"
        )

    def as_dict(self) -> dict[str, str]:
        """JSON-ready form (``avcc kafka acls plan --json``)."""
        return {
            "principal": self.principal,
            "resource_type": self.resource_type,
            "pattern_type": self.pattern_type,
            "resource_name": self.resource_name,
            "operation": self.operation,
        }

    def binding(self) -> Any:
        """The confluent-kafka ``AclBinding`` that creates this grant."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        return AclBinding(
            ResourceType[self.resource_type],
            self.resource_name,
            ResourcePatternType[self.pattern_type],
            self.principal,
            "*",
            AclOperation[self.operation],
            AclPermissionType.ALLOW,
        )

    def covers(self, resource_type: ResourceType, name: str, operation: Operation) -> bool:
        """True when this grant allows ``operation`` on the resource called ``name``."""
        if self.resource_type != resource_type or self.operation != operation:
            return False
        if self.pattern_type == "LITERAL":
            return self.resource_name == name
        return name.startswith(self.resource_name)


def group_principal(group: str) -> str:
    """The Kafka principal a group's workers authenticate as (their SASL user name)."""
    return f"User:{consumer_group_id(group)}"


def internal_prefix(group: str) -> str:
    """The prefix of every internal topic the group owns (changelogs, replies, state)."""
    return f"{consumer_group_id(group)}-"


def _topic_grants(spec: GroupSpec) -> Iterator[tuple[str, Operation]]:
    group = spec.name
    for topic, flow in TOPIC_FLOWS.items():
        writes = group in flow.producers or group in flow.redeliverers
        reads = group in flow.consumers
        if writes:
            yield topic, "WRITE"
        if reads:
            yield topic, "READ"
        if writes or reads:
            yield topic, "DESCRIBE"
    if spec.signed_routes:
        yield NONCES.name, "DESCRIBE_CONFIGS"  # each worker checks it exists as planned


def _group_grants(spec: GroupSpec) -> Iterator[AclGrant]:
    principal = group_principal(spec.name)
    for topic, operation in _topic_grants(spec):
        yield AclGrant(principal, "TOPIC", "LITERAL", topic, operation)
    for operation in _OWNED:
        yield AclGrant(principal, "TOPIC", "PREFIXED", internal_prefix(spec.name), operation)
    for state in STATE_TOPICS.get(spec.name, ()):
        for operation in _OWNED:
            yield AclGrant(principal, "TOPIC", "LITERAL", state.name, operation)
    yield AclGrant(principal, "GROUP", "PREFIXED", consumer_group_id(spec.name), "READ")
    for reader, users in shared_reader_groups().items():
        if spec.name in users:
            yield AclGrant(principal, "GROUP", "LITERAL", reader, "READ")
    if spec.name == "ops":
        yield from _lag_reader_grants(principal)


def _lag_reader_grants(principal: str) -> Iterator[AclGrant]:
    """What the lag page reads: every group's committed offsets and every topic's end offsets."""
    yield AclGrant(principal, "GROUP", "PREFIXED", consumer_group_id(""), "DESCRIBE")
    yield AclGrant(principal, "TOPIC", "PREFIXED", consumer_group_id(""), "DESCRIBE")
    for spec in TOPIC_PLAN:
        yield AclGrant(principal, "TOPIC", "LITERAL", spec.name, "DESCRIBE")


def acl_plan(groups: Iterable[GroupSpec] = GROUPS) -> list[AclGrant]:
    """Every grant of ``groups``, sorted and without duplicates."""
    return sorted({grant for spec in groups for grant in _group_grants(spec)})


def _grant_of(binding: Any) -> AclGrant | None:
    """The grant a described ``AclBinding`` is, ``None`` for a ``DENY`` or a host-limited one."""
    if binding.permission_type.name != "ALLOW" or binding.host != "*":
        return None
    restype, pattern = binding.restype.name, binding.resource_pattern_type.name
    operation = binding.operation.name
    if restype not in ("TOPIC", "GROUP") or pattern not in ("LITERAL", "PREFIXED"):
        return None
    return AclGrant(binding.principal, restype, pattern, binding.name, operation)


def apply_acls(admin: Any, plan: list[AclGrant], timeout_s: float = 30.0) -> tuple[list[AclGrant], list[str]]:
    """Create the grants of ``plan`` missing on the broker behind ``admin`` (a super user's client).

    Returns (created, extra): the grants created, and a line for each ACL of a planned principal
    that the plan does not hold (reported, never deleted: an operator may have added it on purpose).
    """
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    present: set[AclGrant] = set()
    extra: list[str] = []
    wanted = set(plan)
    for principal in sorted({g.principal for g in plan}):
        described = admin.describe_acls(
            AclBindingFilter(
                ResourceType.ANY,
                None,
                ResourcePatternType.ANY,
                principal,
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            ),
            request_timeout=timeout_s,
        ).result(timeout=timeout_s)
        for binding in described:
            grant = _grant_of(binding)
            if grant in wanted:
                present.add(grant)
            else:
                extra.append(str(binding))
    missing = [g for g in plan if g not in present]
    if missing:
        for future in admin.create_acls([g.binding() for g in missing], request_timeout=timeout_s).values():
            future.result(timeout=timeout_s)
    return missing, sorted(extra)
