"""Internal topics derived from the agent groups' tables (faust changelogs).

Their names and partition counts follow from the tables each group declares, so they are
computed from the groups rather than spelled in the plan; ``avcc topics apply`` and every worker
create them explicitly (never through broker auto-creation, which would pick its own partition
count and break co-partitioning).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from app.platform.groups import GROUPS, GroupSpec
from app.platform.topics import DAY_MS, DLQ_STATE, INFINITE, NONCES, TopicSpec

__all__ = ["STATE_TOPICS", "changelog_specs", "group_app", "reply_specs", "worker_topics"]

#: State topics a group keeps besides faust table changelogs (created with them).
STATE_TOPICS: dict[str, tuple[TopicSpec, ...]] = {"ops": (DLQ_STATE,)}


def group_app(group: GroupSpec) -> Any:
    """Import the group's agent module and return its faust App."""
    return importlib.import_module(group.module).app


def changelog_specs(groups: Iterable[GroupSpec] = GROUPS) -> list[TopicSpec]:
    """A compacted topic per table of each group, partitioned like the table, and the group's
    other state topics (:data:`STATE_TOPICS`)."""
    specs: list[TopicSpec] = []
    for group in groups:
        specs.extend(STATE_TOPICS.get(group.name, ()))
        app = group_app(group)
        for table in app.tables.values():
            specs.append(
                TopicSpec(
                    name=table.changelog_topic.get_topic_name(),
                    partitions=int(table.partitions),
                    retention_ms=INFINITE,
                    cleanup_policy="compact",
                    key_field="table key",
                    profile="core",
                    purpose=f"changelog of table {table.name!r} ({group.name} group)",
                )
            )
    return specs


def reply_specs(groups: Iterable[GroupSpec]) -> list[TopicSpec]:
    """The reply topic of each group: faust subscribes it even though no agent asks (it stays
    empty), so every worker of the group shares one stable topic."""
    specs: list[TopicSpec] = []
    for group in groups:
        specs.append(
            TopicSpec(
                name=str(group_app(group).conf.reply_to),
                partitions=1,
                retention_ms=DAY_MS,
                cleanup_policy="delete",
                key_field="correlation id",
                profile="core",
                purpose=f"faust replies of the {group.name} group",
            )
        )
    return specs


def worker_topics(group: GroupSpec) -> list[TopicSpec]:
    """Every internal topic a worker of ``group`` needs before it starts (and the shared nonce
    topic for a group with signed routes, so a worker never claims into a missing topic)."""
    nonces = [NONCES] if group.signed_routes else []
    return [*changelog_specs([group]), *reply_specs([group]), *nonces]
