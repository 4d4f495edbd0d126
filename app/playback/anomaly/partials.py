"""Stage 1 -> stage 2 of the anomaly detector: partial window aggregates, bucketed by code.

Stage 1 (:mod:`~app.playback.anomaly.windows`) closes windows per source partition of
``topic.playback.event``; stage 2 (:mod:`~app.playback.anomaly.merge`) must see the counts of
a code from *every* source partition before applying a threshold. So each closed window is
split by code into buckets -- ``crc32(code) mod`` the partition count of the partials topic
(``ANOMALY_WINDOW_PARTIALS``) -- and each bucket goes to its partition: all partials of a code
meet in one partition whichever worker produced them, and the findings no longer depend on how
many workers share the source partitions.

Record (JSON value; key: the source partition number)::

    {"v": 1, "source": p, "since": ms, "until": ms, "windows": {"<start ms>": WindowAgg JSON}}

One record per bucket each time a source partition's closed bound advances, also when it had no
events (``windows`` empty): the record is that partition's progress marker, which is how stage 2
knows a window is complete. A window part carries every pair (``min_pair_count=1``) and, as
``events``, the whole source partition's count of the window (not just the bucket's codes), so
the merged window knows the total traffic. Records are per window and partition, never per event.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from app.playback.anomaly.rules import WindowAgg
from app.playback.anomaly.windows import PartitionClose

__all__ = ["PARTIALS_VERSION", "Partial", "bucket_of", "decode_partial", "encode_partials", "split_window"]

PARTIALS_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Partial:
    """One decoded partials record: source partition ``source`` closed ``[since, until)``."""

    source: int
    since: int
    until: int
    windows: dict[int, WindowAgg]


def bucket_of(code: str, buckets: int) -> int:
    """The bucket (= partials partition) of ``code``: stable across processes and versions."""
    return zlib.crc32(code.encode()) % buckets


def split_window(agg: WindowAgg, buckets: int) -> list[WindowAgg]:
    """``agg`` split into ``buckets`` parts by code; each part keeps the window's total events."""
    parts = [WindowAgg() for _ in range(buckets)]
    owner: dict[str, WindowAgg] = {}
    for code, count in agg.codes.items():
        part = owner[code] = parts[bucket_of(code, buckets)]
        part.codes[code] = count
    for key, count in agg.nodes.items():
        owner[key[0]].nodes[key] = count
    for key, count in agg.pairs.items():
        owner[key[0]].pairs[key] = count
    for key, entry in agg.points.items():
        owner[key[1]].points[key] = list(entry)
    for part in parts:
        part.events = agg.events
    return parts


def encode_partials(close: PartitionClose, buckets: int) -> list[bytes]:
    """The record of each bucket (index = partials partition) for one source partition's close."""
    split = {start: split_window(agg, buckets) for start, agg in close.windows.items()}
    records: list[bytes] = []
    for bucket in range(buckets):
        windows = {
            str(start): parts[bucket].to_json(None, min_pair_count=1) for start, parts in split.items()
        }
        records.append(
            orjson.dumps(
                {
                    "v": PARTIALS_VERSION,
                    "source": close.partition,
                    "since": close.since,
                    "until": close.until,
                    "windows": windows,
                }
            )
        )
    return records


def decode_partial(raw: bytes | None) -> Partial:
    """Inverse of one record of :func:`encode_partials` (``ValueError`` if it is not one)."""
    try:
        data: Mapping[str, Any] = orjson.loads(raw)  # type: ignore[arg-type]
        if data.get("v") != PARTIALS_VERSION:
            raise ValueError(f"unknown partials version {data.get('v')!r}")
        windows = {int(k): WindowAgg.from_json(v) for k, v in data["windows"].items()}
        return Partial(int(data["source"]), int(data["since"]), int(data["until"]), windows)
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"not a partials record: {exc}") from exc
