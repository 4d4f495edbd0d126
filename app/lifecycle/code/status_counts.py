"""Records by status: kept in memory by each code worker, merged over the replicas that hold them.

Counting by scanning every stored record cost about half a second of a code worker's CPU per
100,000 records, on every reading (the console and the benches poll it). :class:`StatusCounts`
instead keeps the counts of the record partitions this worker holds:

* **rebuilt** by one scan of the worker's records after each partition assignment, once the
  table partitions are recovered (:meth:`StatusCounts.rebuild`);
* **moved** by every durable record write: the code group's record handler passes an ``apply``
  callback knowing the old and the new status (:meth:`StatusCounts.moved`), which the batch
  runtime calls once the write is in the table's changelog and the local store.

Beside the counts it keeps, the same way, since when each ``need_human`` record has waited for a
person, so the oldest wait is known without a scan (:meth:`StatusCounts.oldest_waiting_ms`).

The scan yields to the event loop, so records are written while it runs. Each store partition is
read from an iterator, a snapshot taken when the scan reaches that partition; a write made
meanwhile is logged with the record's version (its ``transitions``, which every write
increases by one). After the scan, a logged move is applied unless the snapshot already held
it: a key not yet moved when the scan read it has every later move applied, a key already moved
is read whole and only the moves past the version it showed are applied. No lock is taken and no
event waits for the scan.

:func:`merge_replicas` combines what each replica answered into the route's body: the counts of
every partition heard from, and each replica that did not answer with the partitions it held.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Final

import orjson

from app.lifecycle.code.records import RecordState
from app.lifecycle.code.time_to_code import waiting_since

__all__ = ["SLICE", "ReplicaCounts", "StatusCounts", "merge_replicas", "stored_status"]

#: Stored values read between two yields to the event loop.
SLICE: Final = 500
_STATUS_FIELD: Final = b'"status":"'

#: ``(key, value)`` pairs of the records table as stored (UTF-8 key, the record's JSON).
RawItems = Callable[[], Iterable[tuple[bytes, bytes]]]


def stored_status(raw: bytes) -> str | None:
    """The status of a stored record without parsing its history: the first ``"status":"`` of
    its JSON is the record's own (``status`` is its second field, before any nested one)."""
    start = raw.find(_STATUS_FIELD)
    if start < 0:
        return None
    start += len(_STATUS_FIELD)
    end = raw.find(b'"', start)
    return raw[start:end].decode() if end > start else None


def _status_and_version(raw: bytes) -> tuple[str | None, int]:
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, -1
    status = record.get("status")
    version = record.get("transitions", len(record.get("history") or ()))
    return (status if isinstance(status, str) else None), int(version)


def _waiting_since(raw: bytes) -> int | None:
    try:
        return waiting_since(RecordState.model_validate_json(raw))
    except ValueError:  # not a record (pydantic's ValidationError is one)
        return None


#: One durable write: old status, new status, version of new, since when it waits for a person.
_Move = tuple[str | None, str | None, int, int | None]


@dataclass(slots=True)
class _ScanLog:
    """Moves made while a scan runs: key -> ``[move]`` in write order."""

    moves: dict[str, list[_Move]] = field(default_factory=dict)


class StatusCounts:
    """Records by status among the record partitions this worker holds (see the module docstring)."""

    def __init__(self, slice_size: int = SLICE) -> None:
        self.slice_size = slice_size
        self._counts: Counter[str] | None = None
        self._waiting: dict[str, int] = {}
        self._partitions: tuple[int, ...] = ()
        self._generation = 0
        self._scan: _ScanLog | None = None
        self._lock = asyncio.Lock()

    @property
    def ready(self) -> bool:
        """Whether the counts of the current assignment are built."""
        return self._counts is not None

    def snapshot(self) -> tuple[tuple[int, ...], dict[str, int]] | None:
        """``(partitions, counts by status)``, ``None`` until rebuilt after the last assignment."""
        if self._counts is None:
            return None
        return self._partitions, {status: n for status, n in sorted(self._counts.items()) if n}

    def oldest_waiting_ms(self) -> int | None:
        """Since when the longest-waiting ``need_human`` record has waited; ``None`` when none
        waits or until rebuilt after the last assignment."""
        if self._counts is None:
            return None
        return min(self._waiting.values(), default=None)

    def invalidate(self) -> None:
        """The worker's partitions changed: the counts wait for the next rebuild (a scan running
        now gives up)."""
        self._generation += 1
        self._counts = None
        self._waiting = {}
        self._scan = None

    def moved(
        self, key: str, old: str | None, new: str | None, version: int, waiting_since_ms: int | None = None
    ) -> None:
        """Record ``key`` went from ``old`` to ``new`` (``None``: absent) in a durable write that
        made it version ``version``; ``waiting_since_ms``: since when it waits for a person
        (:func:`~app.lifecycle.code.time_to_code.waiting_since` of the new record)."""
        move = (old, new, version, waiting_since_ms)
        if self._scan is not None:
            self._scan.moves.setdefault(key, []).append(move)
        if self._counts is not None:
            _move(self._counts, self._waiting, key, move)

    async def rebuild(self, partitions: Sequence[int], items: RawItems) -> bool:
        """Count the stored records of ``partitions`` (what ``items`` iterates); whether the
        counts are built (``False``: the assignment changed meanwhile, try again)."""
        async with self._lock:
            if self._counts is not None:
                return True
            generation = self._generation
            log = self._scan = _ScanLog()
            counts: Counter[str] = Counter()
            waiting: dict[str, int] = {}
            observed: dict[str, int] = {}
            try:
                values = iter(items())
                while chunk := list(islice(values, self.slice_size)):
                    for key, raw in chunk:
                        name = key.decode()
                        if name in log.moves:  # moved since the scan began: was that before this read?
                            status, observed[name] = _status_and_version(raw)
                        else:
                            status = stored_status(raw)
                        if status is not None:
                            counts[status] += 1
                        if status == "need_human" and (since := _waiting_since(raw)) is not None:
                            waiting[name] = since
                    await asyncio.sleep(0)
                    if generation != self._generation:
                        return False
            except RuntimeError:  # the store's partitions changed under the iteration
                return False
            finally:
                if self._scan is log:
                    self._scan = None
            if generation != self._generation:
                return False
            for name, moves in log.moves.items():
                seen = observed.get(name, -1)
                for move in moves:
                    if move[2] > seen:
                        _move(counts, waiting, name, move)
            self._counts, self._waiting = counts, waiting
            self._partitions = tuple(sorted(partitions))
            return True


def _move(counts: Counter[str], waiting: dict[str, int], key: str, move: _Move) -> None:
    old, new, _, since = move
    if old is not None:
        counts[old] -= 1
    if new is not None:
        counts[new] += 1
    if since is None:
        waiting.pop(key, None)
    else:
        waiting[key] = since


@dataclass(frozen=True, slots=True)
class ReplicaCounts:
    """What one replica answered: its partitions and their counts, or why it did not."""

    url: str
    partitions: tuple[int, ...]
    counts: Mapping[str, int] | None = None
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The replica's entry in the route's ``replicas`` list."""
        entry: dict[str, Any] = {
            "url": self.url,
            "partitions": list(self.partitions),
            "answered": self.counts is not None,
        }
        if self.counts is not None:
            entry["counts"] = dict(self.counts)
        if self.error is not None:
            entry["error"] = self.error
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> ReplicaCounts:
        """The entry a peer answered (``counts`` only when it ``answered``)."""
        counts = entry.get("counts") if entry.get("answered") else None
        return cls(
            str(entry["url"]),
            tuple(int(p) for p in entry.get("partitions", ())),
            {str(k): int(v) for k, v in counts.items()} if isinstance(counts, dict) else None,
            entry.get("error"),
        )


def merge_replicas(replicas: Iterable[ReplicaCounts], partitions: int) -> dict[str, Any]:
    """The route's body: counts summed over the replicas that answered, every replica with its
    partitions, and the partitions nobody counted (a replica silent, or no owner yet)."""
    total: Counter[str] = Counter()
    counted: set[int] = set()
    listed = sorted(replicas, key=lambda r: (r.partitions[:1] or (partitions,), r.url))
    for replica in listed:
        if replica.counts is not None:
            total.update(replica.counts)
            counted.update(replica.partitions)
    return {
        "counts": {status: n for status, n in sorted(total.items()) if n},
        "truncated": False,
        "partitions": partitions,
        "missing_partitions": sorted(set(range(partitions)) - counted),
        "replicas": [replica.as_json() for replica in listed],
    }
