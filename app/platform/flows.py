"""Which agent groups produce and consume each topic of the plan (the event flow, as data).

The published AsyncAPI document lists these as each topic's send and receive operations; a unit
test checks the consumers against the topics the faust agents really subscribe to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from app.platform import topics
from app.platform.groups import GROUPS

__all__ = ["RETRYING_GROUPS", "TOPIC_FLOWS", "TopicFlow", "flow_for"]


@dataclass(frozen=True, slots=True)
class TopicFlow:
    """The agent groups (names of ``app.platform.groups.GROUPS``) on either side of a topic."""

    producers: tuple[str, ...]
    consumers: tuple[str, ...]
    #: Groups that write the topic only to redeliver a message taken from it (same key, same event).
    redeliverers: tuple[str, ...] = ()


#: faust groups whose failed messages go through ``topic.system.retry`` (and re-enter their topic).
RETRYING_GROUPS: Final = ("code", "review", "chain", "settlement")
_REDELIVER: Final = ("retry", "ops")
#: Groups serving signed ``/v1/`` routes: every replica claims and reads nonces.
_SIGNED_ROUTES: Final = tuple(group.name for group in GROUPS if group.signed_routes)

TOPIC_FLOWS: Final[Mapping[str, TopicFlow]] = MappingProxyType(
    {
        topics.APPLY_CREATED.name: TopicFlow(("code",), ("review", "code"), _REDELIVER),
        topics.REVIEW_TASK_FINISHED.name: TopicFlow(("review",), ("chain", "code"), _REDELIVER),
        topics.CHAIN_TX_PENDING.name: TopicFlow(("chain", "settlement"), ("chain",), _REDELIVER),
        topics.CHAIN_TX_CONFIRMED.name: TopicFlow(("chain",), ("code", "settlement"), _REDELIVER),
        topics.PLAYBACK_EVENT.name: TopicFlow(("gateway",), ("sink", "anomaly"), ("ops",)),
        topics.DLQ.name: TopicFlow((*RETRYING_GROUPS, "retry", "sink"), ("ops",)),
        topics.RETRY.name: TopicFlow(RETRYING_GROUPS, ("retry",)),
        topics.ANOMALY.name: TopicFlow(("anomaly",), ("sink",), ("ops",)),
        topics.CODE_CLAIMS.name: TopicFlow(("code",), ("code",)),
        topics.CODE_REVIEW_FINISHED.name: TopicFlow(("code",), ("code",), _REDELIVER),
        topics.REVIEW_DECISIONS.name: TopicFlow(("review",), ("review",), _REDELIVER),
        topics.NONCES.name: TopicFlow(_SIGNED_ROUTES, _SIGNED_ROUTES),
    }
)


def flow_for(topic: str) -> TopicFlow:
    """The flow of ``topic``; ``KeyError`` if the plan has no such topic."""
    return TOPIC_FLOWS[topic]
