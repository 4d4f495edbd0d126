"""Agent groups: one faust App id = one Kafka consumer group = one worker command."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GROUPS", "GroupSpec", "group_spec"]


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """An agent group: the module that defines its agents and its offset in the port range."""

    name: str
    module: str
    port_offset: int
    source: str
    #: It serves signed ``/v1/`` routes, so each worker claims and reads the shared nonces.
    signed_routes: bool = False
    #: It keeps state in its data dir (``tables/<group>.py`` says what), restored when lost: its
    #: workers run on volumes of their own (StatefulSets) and can be found recovering.
    local_state: bool = False


GROUPS: tuple[GroupSpec, ...] = (
    GroupSpec("code", "agents.code", 1, "code-svc", signed_routes=True, local_state=True),
    GroupSpec("review", "agents.review", 2, "review-svc", signed_routes=True, local_state=True),
    GroupSpec("chain", "agents.chain", 3, "chain-svc", local_state=True),
    GroupSpec("settlement", "agents.settlement", 4, "settlement-svc", signed_routes=True, local_state=True),
    GroupSpec("gateway", "agents.gateway", 5, "gateway-svc", signed_routes=True),
    GroupSpec("sink", "agents.sink", 6, "clickhouse-sink", signed_routes=True),
    GroupSpec("anomaly", "agents.anomaly", 7, "anomaly-svc", local_state=True),
    GroupSpec("retry", "agents.retry", 8, "retry-svc"),
    GroupSpec("ops", "agents.ops", 0, "ops-svc", local_state=True),
)


def group_spec(name: str) -> GroupSpec:
    """The group called ``name``; ``KeyError`` lists the known ones."""
    for spec in GROUPS:
        if spec.name == name:
            return spec
    raise KeyError(f"unknown group {name!r}; known: {', '.join(g.name for g in GROUPS)}")
