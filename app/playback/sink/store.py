"""Playback store: the ClickHouse tables of playback events and anomalies, and their queries.

Both tables are ``ReplacingMergeTree`` keyed by the event's (or anomaly's) id, so a redelivered
row collapses on merge, and every query deduplicates by id itself so results are exact before
any merge. The DDL runs on Debian's ClickHouse 18.16 and on current releases (chDB).

The rows come from :mod:`app.playback.sink.checks` (hand-written contract check of the
playback events) and :mod:`app.playback.sink.columns` (insert blocks).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import orjson

from app.playback.sink.clickhouse import ClickHouseBackend
from schemas.types import CENT, MAX_EPOCH_MS

__all__ = [
    "ANOMALY_COLUMNS",
    "ANOMALY_INSERT_COLUMNS",
    "ANOMALY_TABLE",
    "DEDUP_WINDOW",
    "ENGINES",
    "EVENT_TYPES",
    "MAX_ANOMALY_LIMIT",
    "PLAYBACK_COLUMNS",
    "PLAYBACK_INSERT_COLUMNS",
    "PLAYBACK_TABLE",
    "TABLE_COLUMNS",
    "Column",
    "SchemaReport",
    "count_distinct_events",
    "ensure_schema",
    "list_anomalies",
    "playback_stats",
    "table_ddl",
]

log = logging.getLogger(__name__)

PLAYBACK_TABLE: Final = "playback_events"
ANOMALY_TABLE: Final = "playback_anomalies"
EVENT_TYPES: Final = ("play", "complete", "purchase")


@dataclass(frozen=True, slots=True)
class Column:
    """A table column; ``default`` is a ClickHouse expression computed server-side on insert."""

    name: str
    type: str
    default: str | None = None

    def ddl(self) -> str:
        """``name Type [DEFAULT expr]``."""
        return f"{self.name} {self.type}" + (f" DEFAULT {self.default}" if self.default else "")


#: Columns of ``playback_events``. Derived columns (``ts``, ``revenue_cny``) are computed by the
#: server from the inserted ones: the client sends plain integers and strings only (the
#: driver's per-row Decimal/DateTime conversions would cost ~20% of the sink's CPU). New
#: columns go at the end, with a default: :func:`ensure_schema` adds missing ones.
PLAYBACK_COLUMNS: Final[tuple[Column, ...]] = (
    Column("event_id", "String"),
    Column("ts", "DateTime", "toDateTime(intDiv(ts_ms, 1000))"),
    Column("ts_ms", "UInt64"),
    Column("source", "String"),
    Column("avcc_code", "String"),
    Column("platform_node", "String"),
    Column("user_hash", "String"),
    Column("event_type", "String"),
    Column("duration_sec", "UInt32"),
    Column("revenue_cents", "Int64"),
    Column("revenue_cny", "Decimal(18, 2)", "toDecimal64(revenue_cents, 2) / 100"),
    Column("idempotency_id", "String"),
    Column("kafka_partition", "UInt16"),
    Column("kafka_offset", "UInt64"),
)
ANOMALY_COLUMNS: Final[tuple[Column, ...]] = (
    Column("anomaly_id", "String"),
    Column("rule", "String"),
    Column("avcc_code", "String"),
    Column("platform_node", "String"),
    Column("user_hash", "String"),
    Column("window_start", "DateTime", "toDateTime(intDiv(window_start_ms, 1000))"),
    Column("window_end", "DateTime", "toDateTime(intDiv(window_end_ms, 1000))"),
    Column("window_start_ms", "UInt64"),
    Column("window_end_ms", "UInt64"),
    Column("observed", "Float64"),
    Column("baseline", "Nullable(Float64)"),
    Column("threshold", "Float64"),
    Column("evidence", "String"),
    Column("detected_at", "DateTime", "toDateTime(intDiv(detected_at_ms, 1000))"),
    Column("detected_at_ms", "UInt64"),
    Column("event_id", "String"),
    Column("source", "String"),
    Column("kafka_partition", "UInt16"),
    Column("kafka_offset", "UInt64"),
)
#: The columns the sink sends, in order (those without a server-side default).
PLAYBACK_INSERT_COLUMNS: Final = tuple(c.name for c in PLAYBACK_COLUMNS if c.default is None)
ANOMALY_INSERT_COLUMNS: Final = tuple(c.name for c in ANOMALY_COLUMNS if c.default is None)

# Old-style MergeTree clauses work on 18.16 and on current releases alike.
ENGINES: Final[dict[str, str]] = {
    PLAYBACK_TABLE: "ReplacingMergeTree() PARTITION BY toYYYYMMDD(ts) ORDER BY (avcc_code, event_id)",
    ANOMALY_TABLE: "ReplacingMergeTree() PARTITION BY toYYYYMM(window_start) ORDER BY (rule, anomaly_id)",
}
TABLE_COLUMNS: Final[dict[str, tuple[Column, ...]]] = {
    PLAYBACK_TABLE: PLAYBACK_COLUMNS,
    ANOMALY_TABLE: ANOMALY_COLUMNS,
}
#: Blocks remembered per table for ``insert_deduplication_token`` (servers that support it).
DEDUP_WINDOW: Final = 1000


def _normalise_type(text: str) -> str:
    return re.sub(r"\s+", "", text)


@dataclass(slots=True)
class SchemaReport:
    """What :func:`ensure_schema` did."""

    created: list[str] = field(default_factory=list)
    added_columns: list[str] = field(default_factory=list)
    type_drift: list[str] = field(default_factory=list)


def table_ddl(table: str) -> str:
    """``CREATE TABLE`` of ``table`` on a single server (in the connection's database)."""
    body = ",\n    ".join(column.ddl() for column in TABLE_COLUMNS[table])
    return f"CREATE TABLE IF NOT EXISTS {table} (\n    {body}\n) ENGINE = {ENGINES[table]}"


def ensure_schema(backend: ClickHouseBackend) -> SchemaReport:
    """Create the tables, add missing columns; idempotent and safe to run from every worker.

    Columns whose type differs from the code are reported (``type_drift``) and left alone: a
    type change is an operator decision. On a cluster (``backend.cluster``) the tables are made
    by :func:`app.playback.sink.cluster.ensure_cluster_schema`.
    """
    if backend.cluster is not None:
        from app.playback.sink.cluster import ensure_cluster_schema

        report = ensure_cluster_schema(backend)
        for drift in report.type_drift:
            log.warning("ClickHouse schema drift on cluster %s: %s", backend.cluster, drift)
        return report
    report = SchemaReport()
    existing = {str(row[0]) for row in backend.execute("SHOW TABLES")}
    for table, columns in TABLE_COLUMNS.items():
        if table not in existing:
            backend.execute(table_ddl(table))
            report.created.append(table)
        current = _columns(backend, table)
        for column in columns:
            if column.name not in current:
                try:
                    backend.execute(f"ALTER TABLE {table} ADD COLUMN {column.ddl()}")
                except Exception:
                    # 18.16 has no ADD COLUMN IF NOT EXISTS: another worker may have won the race.
                    if column.name not in _columns(backend, table):
                        raise
                report.added_columns.append(f"{table}.{column.name}")
            elif _normalise_type(current[column.name]) != _normalise_type(column.type):
                report.type_drift.append(
                    f"{table}.{column.name}: {current[column.name]} (code expects {column.type})"
                )
        if backend.supports_dedup_token and _has_merge_tree_setting(
            backend, "non_replicated_deduplication_window"
        ):
            backend.execute(
                f"ALTER TABLE {table} MODIFY SETTING non_replicated_deduplication_window = {DEDUP_WINDOW}"
            )
    for drift in report.type_drift:
        log.warning("ClickHouse column type drift: %s", drift)
    return report


def _columns(backend: ClickHouseBackend, table: str) -> dict[str, str]:
    rows = backend.query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {table:String}",
        {"table": table},
    )
    return {str(name): str(kind) for name, kind in rows}


def _has_merge_tree_setting(backend: ClickHouseBackend, name: str) -> bool:
    rows = backend.query(
        "SELECT count() FROM system.merge_tree_settings WHERE name = {name:String}", {"name": name}
    )
    return bool(rows and int(rows[0][0]))


# --- queries -------------------------------------------------------------------------------------


def _clamp_ms(value: int) -> int:
    return max(0, min(int(value), MAX_EPOCH_MS))


def _money(value: object) -> str:
    amount = Decimal(str(value)) if value not in (None, "") else Decimal(0)
    return f"{amount.quantize(CENT):.2f}"


def _range_filter(params: dict[str, Any], from_ms: int, to_ms: int, ts_column: str, ms_column: str) -> str:
    params["from_ms"] = _clamp_ms(from_ms)
    params["to_ms"] = _clamp_ms(to_ms)
    # The DateTime bounds let ClickHouse skip whole partitions; the ms bounds are exact.
    return (
        f"{ts_column} >= toDateTime(intDiv({{from_ms:UInt64}}, 1000)) "
        f"AND {ts_column} <= toDateTime(intDiv({{to_ms:UInt64}}, 1000)) "
        f"AND {ms_column} >= {{from_ms:UInt64}} AND {ms_column} < {{to_ms:UInt64}}"
    )


def playback_stats(
    backend: ClickHouseBackend, avcc_code: str | None, from_ms: int, to_ms: int
) -> dict[str, Any]:
    """Exact totals of distinct playback events with ``from_ms <= timestamp < to_ms``.

    Each ``event_id`` counts once whether or not ClickHouse merged its duplicates yet (the
    inner query groups by ``event_id``). ``revenue_cny`` is an exact ``"0.00"`` string.
    """
    params: dict[str, Any] = {}
    where = _range_filter(params, from_ms, to_ms, "ts", "ts_ms")
    if avcc_code is not None:
        where += " AND avcc_code = {avcc_code:String}"
        params["avcc_code"] = avcc_code
    rows = backend.query(
        "SELECT countIf(et = 'play'), countIf(et = 'complete'), countIf(et = 'purchase'), "
        "toString(sum(rev)), uniqExact(uh), count() "
        "FROM (SELECT event_id, any(event_type) AS et, any(revenue_cny) AS rev, any(user_hash) AS uh "
        f"FROM {PLAYBACK_TABLE} WHERE {where} GROUP BY event_id)",
        params,
    )
    plays, completes, purchases, revenue, users, events = rows[0] if rows else (0, 0, 0, "0", 0, 0)
    return {
        "avcc_code": avcc_code,
        "from_ms": params["from_ms"],
        "to_ms": params["to_ms"],
        "plays": int(plays),
        "completes": int(completes),
        "purchases": int(purchases),
        "revenue_cny": _money(revenue),
        "unique_users": int(users),
        "events": int(events),
    }


def count_distinct_events(backend: ClickHouseBackend) -> int:
    """Distinct ``event_id`` values stored (exact)."""
    rows = backend.query(f"SELECT uniqExact(event_id) FROM {PLAYBACK_TABLE}", {})
    return int(rows[0][0]) if rows else 0


_ANOMALY_FIELDS: Final = (
    "anomaly_id",
    "rule",
    "avcc_code",
    "platform_node",
    "user_hash",
    "window_start_ms",
    "window_end_ms",
    "observed",
    "baseline",
    "threshold",
    "evidence",
    "detected_at_ms",
    "event_id",
)
_OPTIONAL_TEXT: Final = frozenset({"avcc_code", "platform_node", "user_hash"})
MAX_ANOMALY_LIMIT: Final = 10_000


def list_anomalies(
    backend: ClickHouseBackend,
    avcc_code: str | None,
    rule: str | None,
    from_ms: int,
    to_ms: int,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Distinct anomalies whose window starts in ``[from_ms, to_ms)``, newest window first."""
    params: dict[str, Any] = {}
    where = _range_filter(params, from_ms, to_ms, "window_start", "window_start_ms")
    if avcc_code is not None:
        where += " AND avcc_code = {avcc_code:String}"
        params["avcc_code"] = avcc_code
    if rule is not None:
        where += " AND rule = {rule:String}"
        params["rule"] = rule
    count = max(0, min(int(limit), MAX_ANOMALY_LIMIT))
    rows = backend.query(
        f"SELECT {', '.join(_ANOMALY_FIELDS)} FROM {ANOMALY_TABLE} WHERE {where} "
        f"ORDER BY window_start_ms DESC, anomaly_id LIMIT 1 BY anomaly_id LIMIT {count}",
        params,
    )
    return [_anomaly_dict(row) for row in rows]


def _anomaly_dict(row: Iterable[Any]) -> dict[str, Any]:
    item: dict[str, Any] = dict(zip(_ANOMALY_FIELDS, row, strict=True))
    for name in _OPTIONAL_TEXT:
        item[name] = item[name] or None
    for name in ("window_start_ms", "window_end_ms", "detected_at_ms"):
        item[name] = int(item[name])
    for name in ("observed", "threshold"):
        item[name] = float(item[name])
    item["baseline"] = None if item["baseline"] is None else float(item["baseline"])
    evidence = item["evidence"]
    item["evidence"] = orjson.loads(evidence) if evidence else {}
    return item
