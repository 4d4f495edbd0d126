"""The sink's tables on a ClickHouse cluster: DDL generated from the single-server schema."""

from __future__ import annotations

import pytest

from app.platform.errors import ConfigurationError
from app.playback.sink.clickhouse import connect
from app.playback.sink.cluster import LOCAL_SUFFIX, cluster_tables
from app.playback.sink.store import ANOMALY_TABLE, PLAYBACK_COLUMNS, PLAYBACK_TABLE, TABLE_COLUMNS


def test_each_table_is_a_replicated_local_table_then_a_distributed_one() -> None:
    tables = cluster_tables("avcc", "stats")
    assert [t.name for t in tables] == [
        f"{PLAYBACK_TABLE}{LOCAL_SUFFIX}",
        PLAYBACK_TABLE,
        f"{ANOMALY_TABLE}{LOCAL_SUFFIX}",
        ANOMALY_TABLE,
    ]
    local, distributed = tables[0], tables[1]
    assert local.engine == "ReplicatedReplacingMergeTree" and distributed.engine == "Distributed"
    assert "ON CLUSTER avcc" in local.ddl and "ON CLUSTER avcc" in distributed.ddl
    assert (
        "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/stats.playback_events', '{replica}')"
        in local.ddl
    )
    assert "ORDER BY (avcc_code, event_id)" in local.ddl  # the single server's key: same dedup by id
    for column in PLAYBACK_COLUMNS:
        assert column.ddl() in local.ddl
    assert distributed.ddl.endswith("Distributed(avcc, stats, playback_events_local, sipHash64(event_id))")
    assert "sipHash64(anomaly_id)" in tables[3].ddl
    assert len(tables) == 2 * len(TABLE_COLUMNS)


@pytest.mark.parametrize("name", ["avcc; DROP TABLE x", "two words", ""])
def test_a_cluster_name_that_is_not_an_identifier_is_refused(name: str) -> None:
    with pytest.raises((ConfigurationError, ValueError)):
        cluster_tables(name, "stats")


def test_a_cluster_needs_a_server_not_chdb(tmp_path: object) -> None:
    with pytest.raises(ConfigurationError, match="needs a clickhouse:// server URL"):
        connect("chdb://chdb", tmp_path, "avcc")  # type: ignore[arg-type]
    backend = connect("clickhouse://127.0.0.1:9/stats", tmp_path, "avcc")  # type: ignore[arg-type]
    assert backend.cluster == "avcc" and "(cluster avcc)" in backend.description
    assert connect("clickhouse://127.0.0.1:9/stats", tmp_path).cluster is None  # type: ignore[arg-type]
