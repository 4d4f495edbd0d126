"""Lag snapshots: the offsets of every consumer group at one moment, as the reader took them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["BROKER_ERROR", "GroupState", "LagSnapshot", "PartitionOffsets"]

#: Group states (librdkafka ``ConsumerGroupState`` names) meaning "members are alive".
_ALIVE_STATES = frozenset({"STABLE", "PREPARING_REBALANCE", "COMPLETING_REBALANCE"})
#: Group states meaning "nobody is consuming".
_DEAD_STATES = frozenset({"EMPTY", "DEAD"})
#: Key of :attr:`LagSnapshot.errors` for a failure that is not specific to one group.
BROKER_ERROR = "*"


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """Offsets of one group on one partition. ``committed`` is ``None`` if never committed."""

    group: str
    topic: str
    partition: int
    end: int
    committed: int | None
    low: int = 0

    @property
    def lag(self) -> int:
        """End minus committed (minus the low watermark if never committed), never negative."""
        base = self.committed if self.committed is not None else self.low
        return max(0, self.end - base)


@dataclass(frozen=True, slots=True)
class GroupState:
    """What the broker says about a group: its state and member count (``None`` if unknown)."""

    group: str
    state: str = "UNKNOWN"
    members: int | None = None

    @property
    def alive(self) -> bool | None:
        """True if members are consuming, False if none, ``None`` if the broker did not say."""
        if self.state in _DEAD_STATES:
            return False
        if self.state in _ALIVE_STATES:
            return True
        return None


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    """All groups' offsets at ``taken_at`` (seconds since the epoch)."""

    taken_at: float
    partitions: tuple[PartitionOffsets, ...] = ()
    groups: Mapping[str, GroupState] = field(default_factory=dict)
    #: group id (or :data:`BROKER_ERROR`) -> error message
    errors: Mapping[str, str] = field(default_factory=dict)
