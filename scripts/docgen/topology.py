"""The topology of the pipeline as data: agent groups, topics, their flows and the groups' stores.

Everything here is read from the topic plan, the groups, the flows and the tables each group's
faust App declares, so the diagrams and tables it renders follow the code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from app.platform import topics as topic_module
from app.platform.flows import TOPIC_FLOWS, TopicFlow
from app.platform.groups import GROUPS, GroupSpec
from app.platform.internal_topics import STATE_TOPICS, group_app
from app.platform.kafka.acls import internal_prefix
from app.platform.settings import Settings
from app.platform.topics import NONCES, TOPIC_PLAN, TopicSpec

__all__ = [
    "SYSTEM_PREFIX",
    "Store",
    "flow_diagram",
    "group_table",
    "scaling_table",
    "state_topic_table",
    "stores",
    "system_diagram",
    "topic_table",
]

#: Topics of the plan named so are the shared machinery (retry, dead letters, nonces), drawn apart.
SYSTEM_PREFIX = "topic.system."
#: faust tables of message ids parked behind a retry are named ``<name>-parked`` (``parking_table``).
PARKED_SUFFIX = "-parked"


@dataclass(frozen=True, slots=True)
class Store:
    """A piece of a group's state: a faust table (RocksDB + changelog) or a state topic of its own."""

    group: str
    name: str
    topic: str
    partitions: int
    cleanup: str
    holds: str
    parked: bool = False


def stores(groups: Iterable[GroupSpec] = GROUPS) -> list[Store]:
    """Every group's tables and state topics, in the groups' order."""
    found: list[Store] = []
    own_specs = [v for v in vars(topic_module).values() if isinstance(v, TopicSpec)]
    for group in groups:
        for table in group_app(group).tables.values():
            topic = table.changelog_topic.get_topic_name()
            parked = table.name.endswith(PARKED_SUFFIX)
            found.append(
                Store(group.name, table.name, topic, int(table.partitions), "compact", table.help, parked)
            )
        extra = [*STATE_TOPICS.get(group.name, ())]
        extra += [s for s in own_specs if s.name.startswith(internal_prefix(group.name))]
        for spec in extra:
            found.append(
                Store(group.name, spec.name, spec.name, spec.partitions, spec.cleanup_policy, spec.purpose)
            )
    return found


def _node(text: str) -> str:
    return re.sub(r"\W", "_", text)


def _group_nodes(names: Iterable[str]) -> list[str]:
    return [f'  g_{_node(name)}(["{name}"])' for name in names]


def _topic_lines(spec: TopicSpec, flow: TopicFlow) -> list[str]:
    node = f"t_{_node(spec.name)}"
    lines = [f'  {node}[["{spec.name} · {spec.partitions}"]]']
    lines += [f"  g_{_node(g)} --> {node}" for g in flow.producers]
    lines += [f"  {node} --> g_{_node(g)}" for g in flow.consumers]
    return lines


def flow_diagram() -> str:
    """Mermaid flowchart of the event flow: groups, the plan's topics (partitions after the dot)
    between them, and each group's stores (its tables and state topics, retry parking left out)."""
    specs = [s for s in TOPIC_PLAN if not s.name.startswith(SYSTEM_PREFIX)]
    used = {g for s in specs for g in (*TOPIC_FLOWS[s.name].producers, *TOPIC_FLOWS[s.name].consumers)}
    lines = ["```mermaid", "flowchart LR"]
    lines += _group_nodes(g.name for g in GROUPS if g.name in used)
    for spec in specs:
        lines += _topic_lines(spec, TOPIC_FLOWS[spec.name])
    for store in stores(g for g in GROUPS if g.name in used):
        if not store.parked:
            node = f"s_{_node(store.group)}_{_node(store.name)}"
            lines += [f'  {node}[("{store.name}")]', f"  g_{_node(store.group)} -.- {node}"]
    return "\n".join([*lines, "```"])


def system_diagram() -> str:
    """Mermaid flowchart of the shared topics (retry, dead letters, nonces) and of the groups that
    write a message back to the topic it came from (retry redelivery, DLQ re-injection)."""
    specs = [s for s in TOPIC_PLAN if s.name.startswith(SYSTEM_PREFIX)]
    flows = [TOPIC_FLOWS[s.name] for s in specs]
    redeliverers = sorted({g for f in TOPIC_FLOWS.values() for g in f.redeliverers})
    used = {g for f in flows for g in (*f.producers, *f.consumers)} | set(redeliverers)
    lines = ["```mermaid", "flowchart LR"]
    lines += _group_nodes(g.name for g in GROUPS if g.name in used)
    for spec, flow in zip(specs, flows, strict=True):
        lines += _topic_lines(spec, flow)
    lines.append('  origin[["the topic the message came from"]]')
    lines += [f"  g_{_node(g)} -. redelivers .-> origin" for g in redeliverers]
    return "\n".join([*lines, "```"])


def _names(items: Iterable[str]) -> str:
    return ", ".join(items) or "—"


def _lines(items: Iterable[str]) -> str:
    return "<br>".join(items) or "—"


def group_table() -> str:
    """One row per agent group: web port, the topics it consumes (the shared nonces left out) and
    the event topics it produces (failures to the shared retry and DLQ topics left out), its
    state, and how Kubernetes runs it."""
    port = Settings.model_fields["web_port"].default
    rows = ["| group | web port | consumes | produces | state | runs as |", "|---|---|---|---|---|---|"]
    all_stores = stores()
    events = [t for t in TOPIC_FLOWS if not t.startswith(SYSTEM_PREFIX)]
    for group in GROUPS:
        consumes = [t for t, f in TOPIC_FLOWS.items() if t != NONCES.name and group.name in f.consumers]
        produces = [t for t in events if group.name in TOPIC_FLOWS[t].producers]
        state = [s.name for s in all_stores if s.group == group.name and not s.parked]
        kind = "StatefulSet" if group.local_state else "Deployment"
        rows.append(
            f"| **{group.name}** | {port + group.port_offset} | {_lines(consumes)} | {_lines(produces)} "
            f"| {_lines(state)} | {kind} |"
        )
    return "\n".join(rows)


def _retention(spec: TopicSpec) -> str:
    days = spec.retention_days
    if days is None:
        return "forever"
    return f"{days:g} d" if days >= 1 else f"{spec.retention_ms / 3_600_000:g} h"


def topic_table() -> str:
    """One row per topic of the plan: layout, key, producer profile, the groups on either side."""
    rows = [
        "| topic | partitions | retention | key | profile | produced by | consumed by | purpose |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for spec in TOPIC_PLAN:
        flow = TOPIC_FLOWS[spec.name]
        producers = [*flow.producers, *(f"{g} (redelivery)" for g in flow.redeliverers)]
        rows.append(
            f"| `{spec.name}` | {spec.partitions} | {_retention(spec)} | {spec.key_field} | {spec.profile} "
            f"| {_names(producers)} | {_names(flow.consumers)} | {spec.purpose} |"
        )
    return "\n".join(rows)


def state_topic_table() -> str:
    """Every table changelog and state topic the groups keep besides the plan: owner, what it holds."""
    rows = ["| topic | group | partitions | cleanup | holds |", "|---|---|---|---|---|"]
    for store in stores():
        rows.append(
            f"| `{store.topic}` | {store.group} | {store.partitions} | {store.cleanup} | {store.holds} |"
        )
    return "\n".join(rows)


def scaling_table() -> str:
    """One row per group: the topics it consumes as a group (partitions in brackets), the most
    workers that get a partition each, and the most that hold table partitions; the nonce topic,
    which every worker reads whole, left out."""
    rows = [
        "| group | consumes as a group | most workers with a partition | most workers with state |",
        "|---|---|---|---|",
    ]
    all_stores = stores()
    for group in GROUPS:
        consumed = [
            spec
            for spec in TOPIC_PLAN
            if spec is not NONCES and group.name in TOPIC_FLOWS[spec.name].consumers
        ]
        most = max((spec.partitions for spec in consumed), default=None)
        tables = [
            s.partitions
            for s in all_stores
            if s.group == group.name and not s.parked and s.cleanup == "compact"
        ]
        shown = ", ".join(f"`{spec.name}` ({spec.partitions})" for spec in consumed) or "— (HTTP only)"
        rows.append(
            f"| {group.name} | {shown} | {most if most is not None else 'any number'} "
            f"| {max(tables) if tables else '—'} |"
        )
    return "\n".join(rows)
