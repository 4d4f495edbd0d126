"""Insert blocks of the sink: the rows of one batch per table, kept as columns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import orjson

from app.playback.sink.checks import ParsedPlayback, playback_columns
from app.playback.sink.clickhouse import ClickHouseBackend
from app.playback.sink.store import (
    ANOMALY_INSERT_COLUMNS,
    ANOMALY_TABLE,
    PLAYBACK_INSERT_COLUMNS,
    PLAYBACK_TABLE,
)
from schemas.envelope import Envelope
from schemas.system import AnomalyDetected

__all__ = ["AnomalyColumns", "PlaybackColumns"]


class PlaybackColumns:
    """Rows of ``playback_events`` for one insert, kept as columns (lists).

    Rows whose ``event_id`` is already in the block are skipped (:attr:`duplicates` counts them):
    the table would collapse them anyway, this just keeps redelivered bursts out of the block.
    """

    __slots__ = ("_columns", "duplicates", "seen")

    column_names: Final = PLAYBACK_INSERT_COLUMNS

    def __init__(self) -> None:
        #: One list per :data:`PLAYBACK_INSERT_COLUMNS` entry.
        self._columns: tuple[list[Any], ...] = tuple([] for _ in PLAYBACK_INSERT_COLUMNS)
        self.seen: set[str] = set()
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._columns[0])

    def add(self, row: ParsedPlayback, partition: int, offset: int) -> bool:
        """Append one parsed event; ``False`` if its ``event_id`` is already in the block."""
        seen = self.seen
        event_id = row[0]
        if event_id in seen:
            self.duplicates += 1
            return False
        seen.add(event_id)
        for column, value in zip(self._columns, (*row, partition, offset), strict=True):
            column.append(value)
        return True

    def add_documents(self, documents: list[Any], partitions: Sequence[int], offsets: Sequence[int]) -> bool:
        """Append a chunk of decoded envelopes if :func:`playback_columns` accepts all of them.

        ``False`` (nothing added) otherwise: check them one by one with :func:`parse_playback`.
        """
        columns = playback_columns(documents)
        if columns is None:
            return False
        event_ids = columns[0]
        seen = self.seen
        if seen.isdisjoint(event_ids):
            before = len(seen)
            seen.update(event_ids)
            if len(seen) - before == len(event_ids):  # no id twice in the chunk either
                for column, values in zip(self._columns, (*columns, partitions, offsets), strict=True):
                    column.extend(values)
                return True
            seen.difference_update(event_ids)  # none was there before: back to how it was
        # Redelivered events inside the chunk or the block: row by row.
        add = self.add
        for row, partition, offset in zip(zip(*columns, strict=True), partitions, offsets, strict=True):
            add(row, partition, offset)
        return True

    def columns(self) -> list[list[Any]]:
        """Fresh column lists in :data:`PLAYBACK_INSERT_COLUMNS` order (callers may mutate them)."""
        return [list(column) for column in self._columns]

    def timestamps_ms(self) -> list[int]:
        """``ts_ms`` of every row (for event-age sampling)."""
        return list(self._columns[1])

    def insert(self, backend: ClickHouseBackend, dedup_token: str | None = None) -> None:
        """Insert the block (no-op when empty)."""
        if len(self):
            backend.insert_columns(PLAYBACK_TABLE, self.column_names, self.columns(), dedup_token)


class AnomalyColumns:
    """Columnar rows of ``playback_anomalies`` (low volume: built from the validated model)."""

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns: tuple[list[Any], ...] = tuple([] for _ in ANOMALY_INSERT_COLUMNS)

    def __len__(self) -> int:
        return len(self.columns[0])

    def add(self, envelope: Envelope[AnomalyDetected], partition: int, offset: int) -> None:
        """Append one anomaly event."""
        a = envelope.payload
        values = (
            a.anomaly_id,
            a.rule,
            a.avcc_code or "",
            a.platform_node or "",
            a.user_hash or "",
            a.window_start_ms,
            a.window_end_ms,
            float(a.observed),
            None if a.baseline is None else float(a.baseline),
            float(a.threshold),
            orjson.dumps(a.evidence, option=orjson.OPT_SORT_KEYS).decode(),
            envelope.timestamp,
            str(envelope.event_id),
            envelope.source,
            partition,
            offset,
        )
        for column, value in zip(self.columns, values, strict=True):
            column.append(value)

    def insert(self, backend: ClickHouseBackend, dedup_token: str | None = None) -> None:
        """Insert the block (no-op when empty)."""
        if len(self):
            columns = [list(column) for column in self.columns]
            backend.insert_columns(ANOMALY_TABLE, ANOMALY_INSERT_COLUMNS, columns, dedup_token)
