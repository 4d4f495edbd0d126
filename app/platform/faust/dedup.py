"""Seen event ids: the one rule by which every stateful consumer skips redelivered events.

Rule: a processed event id is kept at least as long as the retention of the topics it can come
from, taken from the topic plan (and the retry topic, through which any input may come back).
After that no copy of the event is left to be redelivered, so forgetting it is safe; before
that, a redelivery (a replay after a crash, a retry round) is recognised and skipped. Topics
kept forever (``retention_ms = -1``) make their ids kept forever.

The ids live inside each key's state (``{event_id: when processed, epoch ms}``), so they move with
the key's partition and are pruned whenever the key is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.platform.topics import INFINITE, RETRY, TopicSpec

__all__ = ["SeenEvents"]


@dataclass(frozen=True, slots=True)
class SeenEvents:
    """Remembers processed event ids for ``retention_ms`` (``None``: forever)."""

    retention_ms: int | None

    @classmethod
    def for_inputs(cls, *topics: TopicSpec) -> SeenEvents:
        """The rule for a state fed by ``topics``: the longest retention among them and the retry
        topic's."""
        retentions = [t.retention_ms for t in (*topics, RETRY)]
        if INFINITE in retentions:
            return cls(None)
        return cls(max(retentions))

    @staticmethod
    def contains(seen: Mapping[str, int], event_id: str) -> bool:
        """Whether ``event_id`` was processed already."""
        return event_id in seen

    def remember(self, seen: Mapping[str, int], event_id: str, now_ms: int) -> dict[str, int]:
        """``seen`` plus ``event_id`` (seen at ``now_ms``), without the ids past retention."""
        retention = self.retention_ms
        kept = {k: v for k, v in seen.items() if retention is None or now_ms - v < retention}
        kept[event_id] = now_ms
        return kept
