"""The playback tables on a ClickHouse cluster (``AVCC_CLICKHOUSE_CLUSTER``): replicated shards,
read and written through ``Distributed`` tables of the same names.

For each table of :mod:`app.playback.sink.store`:

* ``<table>_local`` on every member, ``ON CLUSTER``: ``ReplicatedReplacingMergeTree`` with the
  single-server table's columns, partitioning and key, its ZooKeeper path per shard
  (``/clickhouse/tables/{shard}/<db>.<table>``) and one replica name per member (``{replica}``);
* ``<table>`` over them: ``Distributed(cluster, db, <table>_local, sipHash64(<id>))``. The sink
  inserts into it with ``insert_distributed_sync = 1``, so an insert is acknowledged only once
  every shard holds its part; the queries read it unchanged.

Why counts stay exact: rows are sharded by their id, so every copy of an event lands on one shard;
a retried insert (the sink retries a failed block whole, rows in the same order) splits into the
same sub-blocks, which the shard's replicas drop by their block checksums (replicated insert
deduplication, kept in ZooKeeper for all replicas of the shard); a redelivered event in another
block collapses on merge (``ReplacingMergeTree`` by id); and every query groups by id before it
counts, so it is exact before any merge.

An existing table with another engine or other columns is reported, never dropped or altered: on
a cluster that is an operator's decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from app.playback.sink.clickhouse import ClickHouseBackend, quote_cluster, quote_identifier
from app.playback.sink.store import ANOMALY_TABLE, ENGINES, PLAYBACK_TABLE, TABLE_COLUMNS, SchemaReport

__all__ = ["LOCAL_SUFFIX", "ClusterTable", "cluster_tables", "ensure_cluster_schema"]

LOCAL_SUFFIX: Final = "_local"
#: The id each table is sharded by: all copies of one row meet on one shard.
_SHARDING_KEYS: Final = {PLAYBACK_TABLE: "event_id", ANOMALY_TABLE: "anomaly_id"}


@dataclass(frozen=True, slots=True)
class ClusterTable:
    """One table to create on the cluster: its name, the engine it must have, its DDL."""

    name: str
    engine: str
    ddl: str


def cluster_tables(cluster: str, database: str) -> list[ClusterTable]:
    """The tables of the sink on ``cluster`` in ``database``: each local table, then its
    ``Distributed`` table (the order they must be created in)."""
    cluster, database = quote_cluster(cluster), quote_identifier(database)
    tables: list[ClusterTable] = []
    for table, columns in TABLE_COLUMNS.items():
        local = f"{table}{LOCAL_SUFFIX}"
        body = ",\n    ".join(column.ddl() for column in columns)
        path = f"/clickhouse/tables/{{shard}}/{database}.{table}"
        engine = ENGINES[table].replace(
            "ReplacingMergeTree()", f"ReplicatedReplacingMergeTree('{path}', '{{replica}}')", 1
        )
        tables.append(
            ClusterTable(
                local,
                "ReplicatedReplacingMergeTree",
                f"CREATE TABLE IF NOT EXISTS {database}.{local} ON CLUSTER {cluster} (\n    {body}\n)"
                f" ENGINE = {engine}",
            )
        )
        shard_by = f"sipHash64({_SHARDING_KEYS[table]})"
        tables.append(
            ClusterTable(
                table,
                "Distributed",
                f"CREATE TABLE IF NOT EXISTS {database}.{table} ON CLUSTER {cluster} AS {database}.{local}"
                f" ENGINE = Distributed({cluster}, {database}, {local}, {shard_by})",
            )
        )
    return tables


def _database(backend: ClickHouseBackend) -> str:
    return str(backend.execute("SELECT currentDatabase()")[0][0])


def ensure_cluster_schema(backend: ClickHouseBackend) -> SchemaReport:
    """Create the missing tables on the backend's cluster; report (never change) existing ones
    whose engine or columns differ from the code's."""
    if backend.cluster is None:
        raise ValueError("ensure_cluster_schema needs a backend on a cluster (AVCC_CLICKHOUSE_CLUSTER)")
    database = _database(backend)
    report = SchemaReport()
    engines = {
        str(name): str(engine)
        for name, engine in backend.query(
            "SELECT name, engine FROM system.tables WHERE database = {db:String}", {"db": database}
        )
    }
    tables = cluster_tables(backend.cluster, database)
    if any(table.name not in engines for table in tables):
        # ON CLUSTER DDL waits for every member: run only when something is missing, so a sink
        # starting while a shard is down goes on to its inserts (which back off) instead
        backend.execute(
            f"CREATE DATABASE IF NOT EXISTS {database} ON CLUSTER {quote_cluster(backend.cluster)}"
        )
    for table in tables:
        if table.name not in engines:
            backend.execute(table.ddl)
            report.created.append(table.name)
        elif engines[table.name] != table.engine:
            report.type_drift.append(
                f"{table.name}: engine {engines[table.name]} (code expects {table.engine})"
            )
    for base, columns in TABLE_COLUMNS.items():
        for name in (base, f"{base}{LOCAL_SUFFIX}"):
            current = {
                str(column): str(kind)
                for column, kind in backend.query(
                    "SELECT name, type FROM system.columns "
                    "WHERE database = {db:String} AND table = {t:String}",
                    {"db": database, "t": name},
                )
            }
            for column in columns:
                if current.get(column.name, "").replace(" ", "") != column.type.replace(" ", ""):
                    found = current.get(column.name, "missing")
                    report.type_drift.append(f"{name}.{column.name}: {found} (code expects {column.type})")
    return report
