"""The ACL plan: least privilege of each group's principal, generated from the topic plan."""

from __future__ import annotations

import pytest

from app.platform.faust.app import consumer_group_id
from app.platform.flows import TOPIC_FLOWS
from app.platform.groups import GROUPS
from app.platform.internal_topics import STATE_TOPICS, changelog_specs, reply_specs
from app.platform.kafka.acls import AclGrant, acl_plan, group_principal, internal_prefix
from app.platform.topics import DLQ, PLAYBACK_EVENT, TOPIC_PLAN

PLAN = acl_plan()


def allowed(group: str, resource_type: str, name: str, operation: str) -> bool:
    principal = group_principal(group)
    return any(
        g.principal == principal and g.covers(resource_type, name, operation)  # type: ignore[arg-type]
        for g in PLAN
    )


@pytest.mark.parametrize("spec", TOPIC_PLAN, ids=lambda s: s.name)
def test_every_topic_of_the_plan_is_written_and_read_by_someone(spec: object) -> None:
    name = spec.name  # type: ignore[attr-defined]
    assert any(allowed(g.name, "TOPIC", name, "WRITE") for g in GROUPS), f"nobody may write {name}"
    assert any(allowed(g.name, "TOPIC", name, "READ") for g in GROUPS), f"nobody may read {name}"


def test_each_group_may_do_what_its_flows_say_and_nothing_else_on_plan_topics() -> None:
    for group in GROUPS:
        for topic, flow in TOPIC_FLOWS.items():
            writes = group.name in flow.producers or group.name in flow.redeliverers
            reads = group.name in flow.consumers
            assert allowed(group.name, "TOPIC", topic, "WRITE") == writes, (group.name, topic)
            assert allowed(group.name, "TOPIC", topic, "READ") == reads, (group.name, topic)
            for operation in ("CREATE", "ALTER_CONFIGS"):
                assert not allowed(group.name, "TOPIC", topic, operation), (group.name, topic, operation)


def test_a_gateway_cannot_read_the_dlq_nor_a_sink_write_the_playback_topic() -> None:
    assert not allowed("gateway", "TOPIC", DLQ.name, "READ")
    assert not allowed("sink", "TOPIC", PLAYBACK_EVENT.name, "WRITE")
    assert not allowed("gateway", "GROUP", consumer_group_id("sink"), "READ")


def test_each_group_owns_its_internal_topics_and_no_other_groups() -> None:
    for group in GROUPS:
        own = [*changelog_specs([group]), *reply_specs([group]), *STATE_TOPICS.get(group.name, ())]
        for spec in own:
            for operation in ("CREATE", "DESCRIBE_CONFIGS", "READ", "WRITE"):
                assert allowed(group.name, "TOPIC", spec.name, operation), (group.name, spec.name, operation)
            others = [
                g.name
                for g in GROUPS
                if g.name != group.name and allowed(g.name, "TOPIC", spec.name, "WRITE")
            ]
            assert others == [], f"{spec.name} is writable by {others}"


def test_no_group_name_prefixes_another_so_prefixed_grants_stay_within_one_group() -> None:
    for a in GROUPS:
        for b in GROUPS:
            if a.name != b.name:
                assert not consumer_group_id(b.name).startswith(consumer_group_id(a.name))
                assert not internal_prefix(b.name).startswith(internal_prefix(a.name))


def test_each_group_reads_its_own_consumer_group_only() -> None:
    for group in GROUPS:
        for other in GROUPS:
            assert allowed(group.name, "GROUP", consumer_group_id(other.name), "READ") == (group is other)


def test_only_ops_describes_other_groups_for_the_lag_page() -> None:
    for group in GROUPS:
        sees = allowed(group.name, "GROUP", consumer_group_id("code"), "DESCRIBE")
        assert sees == (group.name == "ops")


def test_a_grant_becomes_a_confluent_kafka_binding() -> None:
    grant = AclGrant("User:avcc-code", "TOPIC", "PREFIXED", "avcc-code-", "CREATE")
    binding = grant.binding()
    assert (binding.restype.name, binding.resource_pattern_type.name, binding.operation.name) == (
        "TOPIC",
        "PREFIXED",
        "CREATE",
    )
    assert (binding.principal, binding.host, binding.permission_type.name) == ("User:avcc-code", "*", "ALLOW")


def test_the_plan_has_no_duplicates_and_is_sorted() -> None:
    assert sorted(set(PLAN)) == PLAN
