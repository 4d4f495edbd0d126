"""Stage 1 of the anomaly detector: event-time windows per source partition (pure).

The detector keeps one :class:`PartitionState` per owned partition of ``topic.playback.event``
in a :class:`Windows`; it feeds decoded events in as ``(partition, offset, envelope)`` triples
and closes the windows the watermark has passed. Closing does not evaluate anything: each owned
partition reports its closed windows as a :class:`PartitionClose` (its *partial* aggregates and
how far it has closed), which the detector sends to stage 2 (:mod:`~app.playback.anomaly.merge`)
where the partials of every source partition meet. Nothing here touches Kafka, faust or a clock:
the caller passes the wall clock in and does the I/O (producing partials, snapshots, metrics).

Event time
    Tumbling windows of ``window_ms`` on the envelope ``timestamp``. Each partition's watermark
    is the max event time seen in it; the watermark of all windows is the minimum over the
    partitions that still have data to read (a partition at its end of log does not hold time
    back). A window closes -- is handed to stage 2 and forgotten -- once the watermark passes its end
    plus ``lateness_windows`` windows.
Lateness
    An event whose window has already closed is *late*: counted and dropped, never re-opening a
    window. Events more than ``max_future_ms`` ahead of the wall clock are skipped (a bogus
    clock must not close every window).
Duplicates
    Name-based (uuid5, i.e. partner-idempotent) event ids are deduplicated within the open
    windows; random (uuid4) ids are unique by construction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from app.playback.anomaly.rules import WindowAgg
from app.playback.anomaly.settings import AnomalyRuleSettings

__all__ = [
    "SNAPSHOT_VERSION",
    "PartitionClose",
    "PartitionState",
    "Tally",
    "Windows",
]

log = logging.getLogger(__name__)

SNAPSHOT_VERSION: Final = 2
#: Snapshot versions :meth:`PartitionState.from_bytes` reads (v1 also held a partial baseline,
#: now kept by stage 2: it is ignored).
_READABLE_VERSIONS: Final = frozenset({1, SNAPSHOT_VERSION})
#: Decoding failures of an envelope: the event is skipped as undecodable.
_UNDECODABLE: Final = (KeyError, TypeError, ValueError, AttributeError)


@dataclass(slots=True)
class PartitionState:
    """Detector state of one source partition (what a snapshot holds, see :mod:`tables.anomaly`)."""

    partition: int
    #: Next offset to consume (``None``: nothing consumed since the state was created).
    offset: int | None = None
    #: Max event time seen in this partition (epoch ms; -1: none).
    watermark: int = -1
    #: Windows starting before this are closed: events for them are late (epoch ms).
    closed_until: int = 0
    windows: dict[int, WindowAgg] = field(default_factory=dict)
    #: Late events dropped so far (diagnostics).
    late: int = 0
    #: Event ids of name-based (uuid5) events counted per open window, for dedup (not persisted).
    seen: dict[int, set[str]] = field(default_factory=dict)
    #: Changed since the last snapshot.
    dirty: bool = False

    def to_bytes(self, max_pairs: int) -> bytes:
        """The snapshot (JSON)."""
        return orjson.dumps(
            {
                "v": SNAPSHOT_VERSION,
                "partition": self.partition,
                "offset": self.offset,
                "watermark": self.watermark,
                "closed_until": self.closed_until,
                "late": self.late,
                "windows": {str(start): agg.to_json(max_pairs) for start, agg in self.windows.items()},
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> PartitionState:
        """Inverse of :meth:`to_bytes` (``ValueError`` for an unknown snapshot version)."""
        data: Mapping[str, Any] = orjson.loads(raw)
        if data.get("v") not in _READABLE_VERSIONS:
            raise ValueError(f"unknown anomaly snapshot version {data.get('v')!r}")
        offset = data.get("offset")
        return cls(
            partition=int(data["partition"]),
            offset=int(offset) if offset is not None else None,
            watermark=int(data.get("watermark", -1)),
            closed_until=int(data.get("closed_until", 0)),
            windows={int(k): WindowAgg.from_json(v) for k, v in data.get("windows", {}).items()},
            late=int(data.get("late", 0)),
        )


@dataclass(slots=True)
class Tally:
    """What :meth:`Windows.count` did with a run of events."""

    counted: int = 0
    late: int = 0
    undecodable: int = 0
    future: int = 0
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class PartitionClose:
    """One source partition closed every window before ``until`` (those since ``since`` are new).

    ``windows`` holds the partition's aggregates of the newly closed windows that had events;
    a partition without events in them still reports its progress (stage 2 needs every source
    partition's ``until`` to know a window is complete).
    """

    partition: int
    since: int
    until: int
    windows: dict[int, WindowAgg]


class Windows:
    """The open windows, baselines and watermarks of the partitions a detector owns."""

    def __init__(self, rules: AnomalyRuleSettings, *, lateness_windows: int, max_future_ms: int) -> None:
        self.rules = rules
        self.lateness_windows = lateness_windows
        self.max_future_ms = max_future_ms
        self.states: dict[int, PartitionState] = {}
        #: Partitions whose end of log was reached (they do not hold the watermark back).
        self.at_end: set[int] = set()

    # -- ownership -------------------------------------------------------------------------------

    def adopt(self, states: Mapping[int, PartitionState]) -> None:
        """Own these (restored or fresh) partition states; their partitions have data to read."""
        self.states.update(states)
        self.at_end.difference_update(states)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop the state of partitions this detector no longer owns."""
        for partition in partitions:
            self.states.pop(partition, None)
            self.at_end.discard(partition)

    def reached_end(self, partition: int) -> None:
        """``partition`` is read up to its end of log (until its next event)."""
        self.at_end.add(partition)

    # -- counting --------------------------------------------------------------------------------

    def count(self, events: Iterable[tuple[int, int, Any]], now_ms: int) -> Tally:
        """Count ``(partition, offset, envelope)`` events into the windows of their partitions.

        ``envelope`` is the decoded JSON document (``None`` if the bytes were not JSON). Every
        event of an owned partition advances its offset, counted or not; events of partitions
        not owned are ignored.
        """
        states = self.states
        at_end = self.at_end
        cfg = self.rules
        window_ms = cfg.window_ms
        max_ts = now_ms + self.max_future_ms
        tally = Tally()
        counted = late = undecodable = future = duplicates = 0
        last_partition = -1
        state: PartitionState | None = None
        for partition, offset, envelope in events:
            if partition != last_partition:
                state = states.get(partition)
                last_partition = partition
                at_end.discard(partition)
            if state is None:
                continue
            state.offset = offset + 1
            state.dirty = True
            try:
                ts = envelope["timestamp"]
                payload = envelope["payload"]
                event_id = envelope["event_id"]
                code = payload["avcc_code"]
                node = payload["platform_node"]
                user = payload["user_hash"]
                event_type = payload["event_type"]
                duration = payload["duration_sec"]
                revenue = payload["revenue_cny"]
                if ts.__class__ is not int:
                    raise TypeError("timestamp must be an integer")
                if ts > max_ts:
                    future += 1
                    continue
                start = ts - ts % window_ms
                agg = state.windows.get(start)
                if agg is None:
                    if start < state.closed_until:
                        late += 1
                        state.late += 1
                        continue
                    agg = state.windows[start] = WindowAgg()
                if len(event_id) == 36 and event_id[14] == "5":
                    # name-based id (partner idempotency key): drop retried copies
                    if any(event_id in ids for ids in state.seen.values()):
                        duplicates += 1
                        continue
                    state.seen.setdefault(start, set()).add(event_id)
                agg.add(cfg, code, node, user, event_type, duration, revenue, event_id)
            except _UNDECODABLE:
                undecodable += 1
                continue
            if ts > state.watermark:
                state.watermark = ts
            counted += 1
        tally.counted, tally.late, tally.undecodable = counted, late, undecodable
        tally.future, tally.duplicates = future, duplicates
        return tally

    # -- closing ---------------------------------------------------------------------------------

    def watermark(self) -> int:
        """The watermark of all owned partitions (epoch ms; -1: unknown).

        The minimum over the partitions with unread data; when every partition is at its end of
        log, the maximum. A partition with unread data but no event seen yet keeps it unknown.
        """
        reading: list[int] = []
        for partition, state in self.states.items():
            if partition in self.at_end:
                continue
            if state.watermark < 0:
                return -1
            reading.append(state.watermark)
        if reading:
            return min(reading)
        return max((s.watermark for s in self.states.values()), default=-1)

    def close(self, watermark: int) -> list[PartitionClose]:
        """Close every window ``watermark`` has passed in each owned partition (no evaluation).

        Every owned partition whose closed bound advances reports it, with its closed windows;
        later events of a closed window are late.
        """
        if watermark < 0:
            return []
        window_ms = self.rules.window_ms
        bound = watermark - self.lateness_windows * window_ms - window_ms
        closable = bound - bound % window_ms + window_ms if bound >= 0 else 0
        closes: list[PartitionClose] = []
        for state in self.states.values():
            if state.closed_until >= closable:
                continue
            starts = sorted(start for start in state.windows if start < closable)
            closed = {start: state.windows.pop(start) for start in starts}
            for start in starts:
                state.seen.pop(start, None)
            closes.append(PartitionClose(state.partition, state.closed_until, closable, closed))
            state.closed_until = closable
            state.dirty = True
        if closes:
            log.debug("closed windows before %d in %d partitions", closable, len(closes))
        return closes

    def open_windows(self) -> int:
        """Open windows summed over the owned partitions."""
        return sum(len(s.windows) for s in self.states.values())
