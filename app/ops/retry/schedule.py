"""When a held-back retry message may go again: its due time, and the per-partition holds.

Pure bookkeeping of the forwarder (no consumer, no clock of its own): which partitions are paused
until when, which offset each partition must deliver next, and how often a partition was rewound
to its head message without getting it back.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from app.platform.faust.runtime import header_value
from schemas.system import header_name

__all__ = [
    "HEADER_NOT_BEFORE",
    "HEADER_ORIGINAL_PARTITION",
    "HEADER_ORIGINAL_TOPIC",
    "MAX_POLL_S",
    "MAX_REWINDS",
    "PRODUCE_BACKOFF_S",
    "Arrival",
    "PartitionHolds",
    "due_at",
]

HEADER_NOT_BEFORE: Final = header_name("not_before_ms")
HEADER_ORIGINAL_TOPIC: Final = header_name("original_topic")
HEADER_ORIGINAL_PARTITION: Final = header_name("original_partition")
#: Pause a partition this long after a failed produce before trying its head message again.
PRODUCE_BACKOFF_S: Final = 2.0
#: Longest single poll, so due partitions are resumed on time and stop requests are noticed.
MAX_POLL_S: Final = 0.5
#: Rewinds to a held message that did not come back before it is given up as gone.
MAX_REWINDS: Final = 3

TopicPartitionKey = tuple[str, int]
#: What a delivered message is for its partition: ``stale`` (prefetched before a pause or rewind:
#: it will come again), ``lost_seek`` (the held message did not come back first: rewind again),
#: ``gone`` (it never came back: continue here), ``in_order`` (the message to handle now).
Arrival = Literal["stale", "lost_seek", "gone", "in_order"]


def due_at(headers: Any) -> int:
    """Epoch ms from which the message may be redelivered (0: now; unparsable counts as now)."""
    raw = header_value(headers, HEADER_NOT_BEFORE)
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        return 0


class PartitionHolds:
    """Per partition: paused until when, next offset expected, rewinds since its head was handled."""

    def __init__(self) -> None:
        #: (topic, partition) -> epoch ms when it may resume.
        self.paused: dict[TopicPartitionKey, int] = {}
        #: (topic, partition) -> next offset to handle (older deliveries are stale prefetches).
        self.expected: dict[TopicPartitionKey, int] = {}
        #: (topic, partition) -> rewinds since its head message was last handled.
        self.rewound: dict[TopicPartitionKey, int] = {}

    def forget(self, tp: TopicPartitionKey) -> None:
        """Drop everything known about ``tp`` (assigned anew or revoked)."""
        self.paused.pop(tp, None)
        self.expected.pop(tp, None)
        self.rewound.pop(tp, None)

    def hold(self, tp: TopicPartitionKey, offset: int, until_ms: int) -> None:
        """``tp`` was paused and rewound to ``offset``, to be resumed at ``until_ms``."""
        self.paused[tp] = until_ms
        self.expected[tp] = offset
        self.rewound[tp] = self.rewound.get(tp, 0) + 1

    def committed(self, tp: TopicPartitionKey, next_offset: int) -> None:
        """``tp`` committed up to ``next_offset`` (the next message it must deliver)."""
        self.expected[tp] = next_offset

    def take_due(self, now_ms: int) -> list[TopicPartitionKey]:
        """The paused partitions due at ``now_ms``, no longer counted as paused."""
        due = [tp for tp, at in self.paused.items() if at <= now_ms]
        for tp in due:
            del self.paused[tp]
        return due

    def poll_timeout(self, now_ms: int) -> float:
        """Seconds to poll: until the next paused partition is due, within ``[0.01, MAX_POLL_S]``."""
        if not self.paused:
            return MAX_POLL_S
        wait_s = (min(self.paused.values()) - now_ms) / 1000
        return max(0.01, min(MAX_POLL_S, wait_s))

    def arrival(self, tp: TopicPartitionKey, offset: int) -> Arrival:
        """What the message at ``offset`` of ``tp`` is (see :data:`Arrival`).

        Never skips a held message silently: a later offset after a rewind means the seek was
        lost, and only after :data:`MAX_REWINDS` rewinds is the held offset taken as gone.
        """
        expected = self.expected.get(tp, -1)
        if tp in self.paused or offset < expected:
            return "stale"
        if offset > expected >= 0 and tp in self.rewound:
            if self.rewound[tp] <= MAX_REWINDS:
                return "lost_seek"
            self.rewound.pop(tp, None)
            return "gone"
        self.rewound.pop(tp, None)
        return "in_order"
