"""Playback store: ClickHouse tables of playback events and anomalies, row building and queries.

Both tables are ``ReplacingMergeTree`` keyed by the event's (or anomaly's) id, so a redelivered
row collapses on merge, and every query deduplicates by id itself so results are exact before
any merge. The DDL runs on Debian's ClickHouse 18.16 and on current releases (chDB).

The hot path of the sink (:func:`parse_playback` + :class:`PlaybackColumns`) is hand-written:
it accepts exactly what ``app.platform.contracts.decode_event`` accepts for ``topic.playback.event``
(proved by ``tests/unit/test_playback_store.py``) at a fraction of pydantic's cost.
:meth:`PlaybackColumns.add_documents` checks a whole chunk of decoded messages column by column
(C-level ``map``/``set``/``bytes`` operations instead of per-event Python code); a chunk it cannot
prove valid as a whole is left to the per-event :func:`parse_playback`.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import repeat
from operator import itemgetter
from typing import Any, Final

import orjson

from app.playback.sink.clickhouse import ClickHouseBackend
from schemas.envelope import Envelope
from schemas.playback import MAX_DURATION_SEC, PlaybackEvent
from schemas.system import AnomalyDetected
from schemas.types import (
    CENT,
    MA_CODE_PATTERN,
    MAX_EPOCH_MS,
    MIN_EPOCH_MS,
    PLATFORM_NODE_PATTERN,
    SHA256_PATTERN,
    SOURCE_PATTERN,
)

__all__ = [
    "ANOMALY_COLUMNS",
    "ANOMALY_INSERT_COLUMNS",
    "ANOMALY_TABLE",
    "EVENT_TYPES",
    "PLAYBACK_COLUMNS",
    "PLAYBACK_INSERT_COLUMNS",
    "PLAYBACK_TABLE",
    "AnomalyColumns",
    "Column",
    "ParsedPlayback",
    "PlaybackColumns",
    "SchemaReport",
    "count_distinct_events",
    "ensure_schema",
    "list_anomalies",
    "money_cents",
    "parse_playback",
    "playback_columns",
    "playback_row",
    "playback_stats",
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
_ENGINES: Final[dict[str, str]] = {
    PLAYBACK_TABLE: "ReplacingMergeTree() PARTITION BY toYYYYMMDD(ts) ORDER BY (avcc_code, event_id)",
    ANOMALY_TABLE: "ReplacingMergeTree() PARTITION BY toYYYYMM(window_start) ORDER BY (rule, anomaly_id)",
}
_TABLE_COLUMNS: Final[dict[str, tuple[Column, ...]]] = {
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


def ensure_schema(backend: ClickHouseBackend) -> SchemaReport:
    """Create the tables, add missing columns; idempotent and safe to run from every worker.

    Columns whose type differs from the code are reported (``type_drift``) and left alone: a
    type change is an operator decision.
    """
    report = SchemaReport()
    existing = {str(row[0]) for row in backend.execute("SHOW TABLES")}
    for table, columns in _TABLE_COLUMNS.items():
        if table not in existing:
            body = ",\n    ".join(column.ddl() for column in columns)
            backend.execute(f"CREATE TABLE IF NOT EXISTS {table} (\n    {body}\n) ENGINE = {_ENGINES[table]}")
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


# --- fast validation of topic.playback.event ---------------------------------------------------


def _full(pattern: str) -> Callable[[str], re.Match[str] | None]:
    # pydantic's patterns are ``^...$`` with Rust semantics ($ = end of text): fullmatch agrees.
    return re.compile(pattern.removeprefix("^").removesuffix("$")).fullmatch


_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").fullmatch
_SOURCE: Final = _full(SOURCE_PATTERN)
_MA_CODE: Final = _full(MA_CODE_PATTERN)
_NODE: Final = _full(PLATFORM_NODE_PATTERN)
_SHA256: Final = _full(SHA256_PATTERN)
_TOKEN: Final = re.compile(r"[!-~]{1,128}").fullmatch
_MONEY_TEXT: Final = re.compile(r"-?[0-9]{1,12}(?:\.[0-9]{1,2})?").fullmatch
_EVENT_TYPES: Final = frozenset(EVENT_TYPES)
_MA_CODE_MAX: Final = 160
_MONEY_LIMIT: Final = 10**12
_FLOAT_LIMIT: Final = 1e12

#: ``(event_id, ts_ms, source, avcc_code, platform_node, user_hash, event_type, duration_sec,
#: revenue_cents, idempotency_id)``: :data:`PLAYBACK_INSERT_COLUMNS` without the Kafka position.
ParsedPlayback = tuple[str, int, str, str, str, str, str, int, int, str]

#: Strings already known to satisfy a field's pattern (codes, nodes, users and sources repeat a
#: lot; a set lookup costs a tenth of the regex). Bounded: cleared when full.
_KNOWN_LIMIT: Final = 1 << 16
_known_sources: set[str] = set()
_known_codes: set[str] = set()
_known_nodes: set[str] = set()
_known_users: set[str] = set()
#: Money text/float -> cents (prices repeat a lot). Bounded like the sets.
_cents_of_text: dict[str, int] = {}
_cents_of_float: dict[float, int] = {}


def _remember(known: set[str], value: str) -> None:
    if len(known) >= _KNOWN_LIMIT:
        known.clear()
    known.add(value)


def _text_cents(text: str) -> int | None:
    """Cents of a ``NonNegativeMoney`` string (``-?d{1,12}(.d{1,2})?``, only a negative zero)."""
    if _MONEY_TEXT(text) is None:
        return None
    whole, _, fraction = text.removeprefix("-").partition(".")
    cents = int(whole) * 100 + (int(fraction) * (10 if len(fraction) == 1 else 1) if fraction else 0)
    if text[0] == "-" and cents:
        return None
    return cents


def money_cents(value: object) -> int | None:
    """Exact cents of a JSON money value, or ``None`` where ``NonNegativeMoney`` refuses it.

    Strings ``"12.5"``, integers and floats with at most two decimals (``repr``), below 10**12,
    not negative (a negative zero is 0).
    """
    kind = type(value)
    if kind is str:
        text: str = value  # type: ignore[assignment]
        cents = _cents_of_text.get(text)
        if cents is None:
            cents = _text_cents(text)
            if cents is None:
                return None
            if len(_cents_of_text) >= _KNOWN_LIMIT:
                _cents_of_text.clear()
            _cents_of_text[text] = cents
        return cents
    if kind is int:
        number: int = value  # type: ignore[assignment]
        return number * 100 if 0 <= number < _MONEY_LIMIT else None
    if kind is float:
        real: float = value  # type: ignore[assignment]
        cents = _cents_of_float.get(real)
        if cents is not None:
            return cents
        if not math.isfinite(real) or abs(real) >= _FLOAT_LIMIT or real < 0:
            return None
        text = repr(real)
        if "e" in text or len(text.partition(".")[2]) > 2:
            return None
        cents = _text_cents(text)
        if cents is not None:
            if len(_cents_of_float) >= _KNOWN_LIMIT:
                _cents_of_float.clear()
            _cents_of_float[real] = cents
        return cents
    return None


def parse_playback(obj: object) -> ParsedPlayback | None:
    """The row of a playback envelope (already JSON-decoded), or ``None`` if it breaks the contract.

    Equivalent to ``Envelope[PlaybackEvent]`` in strict mode on orjson output: exact keys, exact
    JSON types (no bool-as-int, no float-as-int), patterns, enums, ranges, money with at most
    two decimals. A value of the wrong JSON type makes a set lookup or a regex raise
    ``TypeError``, which is a refusal too.
    """
    if type(obj) is not dict or len(obj) != 4:
        return None
    try:
        event_id = obj["event_id"]
        ts_ms = obj["timestamp"]
        source = obj["source"]
        payload = obj["payload"]
        if _UUID(event_id) is None:
            return None
        if type(ts_ms) is not int or not MIN_EPOCH_MS <= ts_ms < MAX_EPOCH_MS:
            return None
        if source not in _known_sources:
            if _SOURCE(source) is None:
                return None
            _remember(_known_sources, source)
        if type(payload) is not dict:
            return None
        size = len(payload)
        avcc_code = payload["avcc_code"]
        node = payload["platform_node"]
        user_hash = payload["user_hash"]
        event_type = payload["event_type"]
        duration = payload["duration_sec"]
        revenue = payload["revenue_cny"]
        if size == 6:
            idempotency_id = ""
        elif size == 7 and "idempotency_id" in payload:
            token = payload["idempotency_id"]
            if token is None:
                idempotency_id = ""
            elif _TOKEN(token) is not None:
                idempotency_id = token
            else:
                return None
        else:
            return None
        if avcc_code not in _known_codes:
            if _MA_CODE(avcc_code) is None or len(avcc_code) > _MA_CODE_MAX:
                return None
            _remember(_known_codes, avcc_code)
        if node not in _known_nodes:
            if _NODE(node) is None:
                return None
            _remember(_known_nodes, node)
        if user_hash not in _known_users:
            if _SHA256(user_hash) is None:
                return None
            _remember(_known_users, user_hash)
        if event_type not in _EVENT_TYPES:
            return None
    except (KeyError, TypeError):
        return None
    if type(duration) is not int or not 0 <= duration <= MAX_DURATION_SEC:
        return None
    revenue_cents = _cents_of_text.get(revenue) if type(revenue) is str else None
    if revenue_cents is None:
        revenue_cents = money_cents(revenue)
        if revenue_cents is None:
            return None
    return (
        event_id,
        ts_ms,
        source,
        avcc_code,
        node,
        user_hash,
        event_type,
        duration,
        revenue_cents,
        idempotency_id,
    )


def playback_row(envelope: Envelope[PlaybackEvent]) -> ParsedPlayback:
    """The row of an already validated event (what :func:`parse_playback` returns for its JSON)."""
    p = envelope.payload
    return (
        str(envelope.event_id),
        envelope.timestamp,
        envelope.source,
        p.avcc_code,
        p.platform_node,
        p.user_hash,
        p.event_type,
        p.duration_sec,
        int(p.revenue_cny * 100),
        p.idempotency_id or "",
    )


# --- chunk-wise (columnar) validation --------------------------------------------------------

_HEX_DIGITS: Final = b"0123456789abcdef"
#: Fixed-width formats checked column-wise: ``x`` is one of ``[0-9a-f]``, anything else itself.
_UUID_TEMPLATE: Final = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
#: ``SHA256_PATTERN`` as a template; ``None`` (per-value regex) if the schema's pattern changed.
_SHA256_TEMPLATE: Final = "sha256:" + "x" * 64 if SHA256_PATTERN == r"^sha256:[0-9a-f]{64}$" else None

_ENVELOPE_FIELDS: Final = (itemgetter("event_id"), itemgetter("timestamp"), itemgetter("source"))
_PAYLOAD_OF: Final = itemgetter("payload")
_PAYLOAD_FIELDS: Final = tuple(
    itemgetter(name)
    for name in ("avcc_code", "platform_node", "user_hash", "event_type", "duration_sec", "revenue_cny")
)
_MISSING: Final = object()
#: Number of :data:`ParsedPlayback` fields.
_ROW_WIDTH: Final = 10


def _all_fixed(values: list[Any], template: str) -> bool:
    """Whether every value is a ``str`` of ``template``'s shape (see :data:`_UUID_TEMPLATE`).

    Same verdict as a per-value ``fullmatch`` of the equivalent regex, in C-level string ops:
    join, check the literal positions by slicing, delete the hex digits, count what is left.
    """
    count = len(values)
    width = len(template)
    try:
        joined = "".join(values)
    except TypeError:  # a value that is not a string
        return False
    if len(joined) != width * count or set(map(len, values)) != {width}:
        return False
    try:
        raw = joined.encode("ascii")
    except UnicodeEncodeError:
        return False
    literal_left = 0
    for position, char in enumerate(template):
        if char == "x":
            continue
        if raw[position::width] != char.encode("ascii") * count:
            return False
        if char.encode("ascii") not in _HEX_DIGITS:
            literal_left += 1
    # Only the literal non-hex characters may survive deleting the hex digits.
    return len(raw.translate(None, _HEX_DIGITS)) == literal_left * count


def _all_known_or_valid(values: list[Any], known: set[str], check: Callable[[str], object]) -> bool:
    """Whether every value is a ``str`` in ``known`` or passing ``check`` (which then joins ``known``)."""
    try:
        distinct = set(values)
    except TypeError:  # unhashable: a list or an object
        return False
    if distinct <= known:
        return True
    fresh = distinct - known
    for value in fresh:
        if type(value) is not str or not check(value):
            return False
    if len(known) + len(fresh) > _KNOWN_LIMIT:
        known.clear()
    if len(fresh) <= _KNOWN_LIMIT:
        known |= fresh
    return True


def _valid_code(value: str) -> bool:
    return len(value) <= _MA_CODE_MAX and _MA_CODE(value) is not None


def _valid_user(value: str) -> bool:
    return _SHA256(value) is not None


def _int_column_within(values: list[Any], low: int, high: int) -> bool:
    """Every value an ``int`` (not a ``bool``) with ``low <= value <= high``."""
    return set(map(type, values)) == {int} and min(values) >= low and max(values) <= high


def _idempotency_column(payloads: list[dict[str, Any]], count: int) -> list[str] | None:
    sizes = set(map(len, payloads))
    if sizes == {6}:
        return [""] * count
    if not sizes <= {6, 7}:
        return None
    tokens = list(map(dict.get, payloads, repeat("idempotency_id"), repeat(_MISSING)))
    # Every payload of 7 keys must have its seventh be the idempotency id.
    if count - tokens.count(_MISSING) != sum(map(len, payloads)) - 6 * count:
        return None
    column: list[str] = []
    for token in tokens:
        if token is _MISSING or token is None:
            column.append("")
        elif type(token) is str and _TOKEN(token) is not None:
            column.append(token)
        else:
            return None
    return column


def playback_columns(documents: list[Any]) -> list[list[Any]] | None:
    """The :data:`ParsedPlayback` columns of decoded envelopes, or ``None`` unless *all* are valid.

    Accepts a chunk exactly when :func:`parse_playback` accepts every document of it, with the
    same values (column ``i`` holds field ``i`` of each row); otherwise returns ``None`` and the
    caller checks the documents one by one. Costs a fraction of the per-document check: the
    per-value work is C-level ``map``, ``set`` and ``bytes`` operations.
    """
    count = len(documents)
    if not count:
        return [[] for _ in range(_ROW_WIDTH)]
    # orjson decodes to dict, list, str, int, float, bool or None: a string-keyed lookup that
    # succeeds proves a dict (the others raise TypeError), so no separate type pass is needed.
    try:
        if set(map(len, documents)) != {4}:
            return None
        event_ids, timestamps, sources = (list(map(get, documents)) for get in _ENVELOPE_FIELDS)
        payloads = list(map(_PAYLOAD_OF, documents))
        codes, nodes, users, kinds, durations, revenues = (
            list(map(get, payloads)) for get in _PAYLOAD_FIELDS
        )
        if not set(kinds) <= _EVENT_TYPES:
            return None
        distinct_revenues = set(revenues)
    except (KeyError, TypeError):  # a missing field; not a dict; an unhashable value
        return None
    if not (
        _all_fixed(event_ids, _UUID_TEMPLATE)
        and _int_column_within(timestamps, MIN_EPOCH_MS, MAX_EPOCH_MS - 1)
        and _int_column_within(durations, 0, MAX_DURATION_SEC)
        and _all_known_or_valid(sources, _known_sources, _SOURCE)
        and _all_known_or_valid(codes, _known_codes, _valid_code)
        and _all_known_or_valid(nodes, _known_nodes, _NODE)
        and (
            _all_fixed(users, _SHA256_TEMPLATE)
            if _SHA256_TEMPLATE is not None
            else _all_known_or_valid(users, _known_users, _valid_user)
        )
    ):
        return None
    cents_of: dict[str, int] = {}
    for revenue in distinct_revenues:
        if type(revenue) is not str:  # numbers: the per-document check decides
            return None
        cents = money_cents(revenue)
        if cents is None:
            return None
        cents_of[revenue] = cents
    idempotency_ids = _idempotency_column(payloads, count)
    if idempotency_ids is None:
        return None
    return [
        event_ids,
        timestamps,
        sources,
        codes,
        nodes,
        users,
        kinds,
        durations,
        list(map(cents_of.__getitem__, revenues)),
        idempotency_ids,
    ]


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
        distinct = set(event_ids)
        seen = self.seen
        if len(distinct) == len(event_ids) and seen.isdisjoint(distinct):
            seen |= distinct
            for column, values in zip(self._columns, (*columns, partitions, offsets), strict=True):
                column.extend(values)
            return True
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
