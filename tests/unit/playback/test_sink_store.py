"""Playback store: insert blocks, DDL and queries on chDB, and ClickHouse URLs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.platform.errors import ConfigurationError, DependencyUnavailable
from app.playback.sink.checks import parse_playback
from app.playback.sink.clickhouse import ChdbBackend, DriverBackend, connect
from app.playback.sink.columns import AnomalyColumns, PlaybackColumns
from app.playback.sink.store import (
    ANOMALY_INSERT_COLUMNS,
    PLAYBACK_COLUMNS,
    PLAYBACK_INSERT_COLUMNS,
    PLAYBACK_TABLE,
    count_distinct_events,
    ensure_schema,
    list_anomalies,
    playback_stats,
)
from schemas import AnomalyDetected, make_envelope
from schemas.envelope import Envelope
from schemas.types import MAX_EPOCH_MS
from testing.ports import free_port
from tests.unit.playback.playback_documents import T0, USER, event

# --- row building --------------------------------------------------------------------------------


def _parsed(i: int, **payload: Any) -> tuple[Any, ...]:
    document = event(**payload)
    document["event_id"] = str(uuid.UUID(int=i, version=4))
    document["timestamp"] = T0 + i
    row = parse_playback(document)
    assert row is not None
    return row


def test_playback_columns_are_in_insert_order_and_skip_duplicates() -> None:
    block = PlaybackColumns()
    assert block.add(_parsed(1), 3, 100)
    assert block.add(_parsed(2, event_type="purchase", revenue_cny="9.99"), 4, 7)
    assert not block.add(_parsed(1), 5, 101)  # same event_id redelivered inside the block
    assert len(block) == 2
    assert block.duplicates == 1
    columns = dict(zip(block.column_names, block.columns(), strict=True))
    assert tuple(columns) == PLAYBACK_INSERT_COLUMNS
    assert "ts" not in columns
    assert "revenue_cny" not in columns  # computed server-side
    assert columns["ts_ms"] == [T0 + 1, T0 + 2]
    assert columns["revenue_cents"] == [0, 999]
    assert columns["kafka_partition"] == [3, 4]
    assert columns["kafka_offset"] == [100, 7]
    assert columns["idempotency_id"] == ["", ""]
    first, second = block.columns(), block.columns()
    assert first == second and first[0] is not second[0]  # fresh lists: retries resend originals
    assert block.timestamps_ms() == [T0 + 1, T0 + 2]


def _document(i: int) -> dict[str, Any]:
    document = event()
    document["event_id"] = str(uuid.UUID(int=i, version=4))
    document["timestamp"] = T0 + i
    return document


def test_chunks_of_documents_keep_one_row_per_event_id() -> None:
    """A chunk repeating an id, or repeating one already in the block, is added row by row:
    each id once, the repeats counted, and the ids of the chunk still known afterwards."""
    block = PlaybackColumns()
    assert block.add_documents([_document(1), _document(2)], [0, 0], [10, 11])
    assert block.add_documents([_document(3), _document(3), _document(4)], [1, 1, 1], [5, 6, 7])
    assert block.add_documents([_document(2), _document(5)], [0, 2], [12, 1])
    columns = dict(zip(block.column_names, block.columns(), strict=True))
    assert columns["ts_ms"] == [T0 + 1, T0 + 2, T0 + 3, T0 + 4, T0 + 5]
    assert columns["kafka_offset"] == [10, 11, 5, 7, 1]
    assert block.duplicates == 2
    assert block.seen == {str(uuid.UUID(int=i, version=4)) for i in range(1, 6)}
    assert not block.add_documents([{"event_id": "not a uuid"}], [0], [13])  # left to the caller
    assert len(block) == 5


def test_every_insert_column_exists_in_the_ddl() -> None:
    names = {column.name for column in PLAYBACK_COLUMNS}
    assert set(PLAYBACK_INSERT_COLUMNS) <= names
    assert {c.name for c in PLAYBACK_COLUMNS if c.default} == {"ts", "revenue_cny"}


# --- DDL and queries on chDB ---------------------------------------------------------------------


@pytest.fixture
def chdb(tmp_path: Path) -> Iterator[ChdbBackend]:
    backend = connect(f"chdb://{tmp_path / 'chdb'}", tmp_path)
    assert isinstance(backend, ChdbBackend)
    yield backend
    backend.close()  # chDB serves one path per process: free it for the next test


def _block(rows: list[tuple[int, dict[str, Any]]], first_offset: int = 0) -> PlaybackColumns:
    block = PlaybackColumns()
    for offset, (i, payload) in enumerate(rows, start=first_offset):
        block.add(_parsed(i, **payload), i % 24, offset)
    return block


def test_ensure_schema_is_idempotent(chdb: ChdbBackend) -> None:
    first = ensure_schema(chdb)
    assert sorted(first.created) == ["playback_anomalies", "playback_events"]
    second = ensure_schema(chdb)
    assert second.created == [] and second.added_columns == [] and second.type_drift == []


def test_ensure_schema_adds_missing_columns(chdb: ChdbBackend) -> None:
    chdb.execute(
        f"CREATE TABLE {PLAYBACK_TABLE} (event_id String, ts_ms UInt64, avcc_code String, "
        "ts DateTime DEFAULT toDateTime(intDiv(ts_ms, 1000))) "
        "ENGINE = ReplacingMergeTree() PARTITION BY toYYYYMMDD(ts) ORDER BY (avcc_code, event_id)"
    )
    report = ensure_schema(chdb)
    assert "playback_events.revenue_cny" in report.added_columns
    assert "playback_events.kafka_offset" in report.added_columns
    ensure_schema(chdb)
    _block([(1, {"event_type": "purchase", "revenue_cny": "3.10"})]).insert(chdb)
    assert playback_stats(chdb, None, 0, MAX_EPOCH_MS)["revenue_cny"] == "3.10"


def test_stats_are_exact_with_duplicates_before_any_merge(chdb: ChdbBackend) -> None:
    ensure_schema(chdb)
    rows = [
        (
            i,
            {
                "event_type": ("play", "complete", "purchase")[i % 3],
                "revenue_cny": "0.10" if i % 3 == 2 else 0,
            },
        )
        for i in range(300)
    ]
    other: dict[str, Any] = {"avcc_code": "MA.156.1.2/other", "event_type": "purchase", "revenue_cny": "0.05"}
    rows += [(300, other)]
    _block(rows).insert(chdb, "token-1")
    _block(rows).insert(chdb, "token-1")  # same batch retried with its token
    _block(rows[:150], first_offset=1000).insert(chdb)  # redelivered after a crash
    _block(rows[100:], first_offset=2000).insert(chdb, "token-2")
    stored = chdb.query(f"SELECT count() FROM {PLAYBACK_TABLE}", {})[0][0]
    assert int(stored) > 301  # duplicates really are stored; queries must not count them
    assert count_distinct_events(chdb) == 301
    stats = playback_stats(chdb, None, 0, MAX_EPOCH_MS)
    assert stats == {
        "avcc_code": None,
        "from_ms": 0,
        "to_ms": MAX_EPOCH_MS,
        "plays": 100,
        "completes": 100,
        "purchases": 101,
        "revenue_cny": "10.05",
        "unique_users": 1,
        "events": 301,
    }
    code = playback_stats(chdb, "MA.156.10005.8361/work-1", T0, T0 + 150)  # [T0, T0+150)
    assert (code["events"], code["plays"], code["purchases"], code["revenue_cny"]) == (150, 50, 50, "5.00")
    assert playback_stats(chdb, "MA.156.1.2/other", 0, MAX_EPOCH_MS)["revenue_cny"] == "0.05"
    assert playback_stats(chdb, "MA.156.9.9/none", 0, MAX_EPOCH_MS)["revenue_cny"] == "0.00"


def _anomaly(anomaly_id: str, rule: str, start: int, **extra: Any) -> Envelope[AnomalyDetected]:
    payload = AnomalyDetected(
        anomaly_id=anomaly_id,
        rule=rule,  # type: ignore[arg-type]
        window_start_ms=start,
        window_end_ms=start + 60_000,
        observed=12.0,
        threshold=5.0,
        evidence={"events": 12, "ratio": 2.4},
        **extra,
    )
    return make_envelope(payload, source="anomaly-svc", timestamp_ms=start + 61_000)


def test_anomalies_are_listed_once_and_filtered(chdb: ChdbBackend) -> None:
    ensure_schema(chdb)
    block = AnomalyColumns()
    block.add(_anomaly("a-1", "traffic_spike", T0, avcc_code="MA.156.1.2/x", baseline=3.0), 0, 1)
    block.add(_anomaly("a-2", "user_replay", T0 + 120_000, user_hash=USER), 1, 1)
    block.add(_anomaly("a-1", "traffic_spike", T0, avcc_code="MA.156.1.2/x", baseline=3.0), 0, 9)
    assert len(block) == 3 and len(block.columns) == len(ANOMALY_INSERT_COLUMNS)
    block.insert(chdb)
    block.insert(chdb)
    found = list_anomalies(chdb, None, None, 0, MAX_EPOCH_MS, 100)
    assert [a["anomaly_id"] for a in found] == ["a-2", "a-1"]
    spike = found[1]
    assert spike["avcc_code"] == "MA.156.1.2/x" and spike["user_hash"] is None
    assert spike["baseline"] == 3.0 and spike["evidence"] == {"events": 12, "ratio": 2.4}
    assert spike["window_start_ms"] == T0 and spike["detected_at_ms"] == T0 + 61_000
    assert [a["anomaly_id"] for a in list_anomalies(chdb, "MA.156.1.2/x", None, 0, MAX_EPOCH_MS, 10)] == [
        "a-1"
    ]
    assert [a["anomaly_id"] for a in list_anomalies(chdb, None, "user_replay", 0, MAX_EPOCH_MS, 10)] == [
        "a-2"
    ]
    assert list_anomalies(chdb, None, None, T0 + 1, T0 + 120_000, 10) == []
    assert len(list_anomalies(chdb, None, None, 0, MAX_EPOCH_MS, 1)) == 1


# --- connect() -------------------------------------------------------------------------------------


def test_connect_parses_urls(tmp_path: Path) -> None:
    server = connect("clickhouse://user:p%40ss@db.example:9440/avcc?secure=1", tmp_path)
    assert isinstance(server, DriverBackend)
    assert server.database == "avcc" and server.description == "clickhouse://db.example:9440/avcc"
    assert "p@ss" not in server.description
    default = connect("clickhouse://localhost", tmp_path)
    assert isinstance(default, DriverBackend)
    assert default.description == "clickhouse://localhost:9000/default"
    for bad in ("mysql://x/y", "clickhouse:///db", "clickhouse://h/bad-name", "clickhouse://h:notaport/x"):
        with pytest.raises(ConfigurationError):
            connect(bad, tmp_path)


def test_relative_chdb_path_is_under_the_data_dir(tmp_path: Path) -> None:
    backend = connect("chdb://store/chdb", tmp_path)
    try:
        assert isinstance(backend, ChdbBackend)
        assert backend.path == (tmp_path / "store" / "chdb").resolve()
    finally:
        backend.close()


def test_unreachable_server_is_dependency_unavailable(tmp_path: Path) -> None:
    backend = connect(f"clickhouse://127.0.0.1:{free_port()}/default", tmp_path)
    with pytest.raises(DependencyUnavailable):
        backend.execute("SELECT 1")
    with pytest.raises(DependencyUnavailable):
        backend.insert_columns(PLAYBACK_TABLE, ["event_id"], [["x"]], None)
    backend.close()
