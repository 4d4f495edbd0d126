"""Playback store: the fast validator equals the schema, row building, money, DDL and queries on chDB."""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.platform.contracts import decode_event
from app.platform.errors import NON_RETRIABLE, ConfigurationError, DependencyUnavailable
from app.platform.topics import PLAYBACK_EVENT
from app.playback.sink.clickhouse import ChdbBackend, DriverBackend, connect
from app.playback.sink.store import (
    ANOMALY_INSERT_COLUMNS,
    PLAYBACK_COLUMNS,
    PLAYBACK_INSERT_COLUMNS,
    PLAYBACK_TABLE,
    AnomalyColumns,
    PlaybackColumns,
    count_distinct_events,
    ensure_schema,
    list_anomalies,
    money_cents,
    parse_playback,
    playback_columns,
    playback_row,
    playback_stats,
)
from app.servers import free_port
from schemas import AnomalyDetected, make_envelope, parse_money
from schemas.envelope import Envelope
from schemas.playback import MAX_DURATION_SEC, PlaybackEvent
from schemas.types import MAX_EPOCH_MS, MIN_EPOCH_MS

T0 = 1_717_312_200_000
USER = "sha256:" + "ab" * 32


def event(**payload: Any) -> dict[str, Any]:
    """A valid playback envelope as the gateway writes it; ``payload`` overrides fields."""
    body: dict[str, Any] = {
        "avcc_code": "MA.156.10005.8361/work-1",
        "platform_node": "8361",
        "user_hash": USER,
        "event_type": "play",
        "duration_sec": 1800,
        "revenue_cny": "0.00",
    }
    body.update(payload)
    return {
        "event_id": "8f14e45f-ceea-467a-9575-3b1b2b7e7a10",
        "timestamp": T0,
        "source": "gateway-svc",
        "payload": body,
    }


def schema_row(raw: bytes) -> tuple[Any, ...] | None:
    """The reference: what ``decode_event`` accepts, as a row (``None`` when it refuses)."""
    try:
        envelope = decode_event(PLAYBACK_EVENT.name, raw)
    except NON_RETRIABLE:
        return None
    assert isinstance(envelope.payload, PlaybackEvent)
    return playback_row(envelope)  # type: ignore[arg-type]


def fast_row(raw: bytes) -> tuple[Any, ...] | None:
    """What the sink's hot path does with the same bytes."""
    try:
        return parse_playback(orjson.loads(raw))
    except (orjson.JSONDecodeError, TypeError):
        return None


def assert_same_verdict(document: Any) -> tuple[Any, ...] | None:
    raw = document if isinstance(document, bytes) else orjson.dumps(document)
    expected = schema_row(raw)
    got = fast_row(raw)
    assert got == expected, f"fast={got!r} schema={expected!r} for {raw[:300]!r}"
    return got


# --- fast validator == schema ----------------------------------------------------------------

#: Replacement values per payload field: valid and invalid ones, all JSON-encodable.
_COMMON_BAD: list[Any] = [None, True, False, 0, 1, -1, 1.5, "", " ", [], {}, ["play"], {"a": 1}]
PAYLOAD_VARIANTS: dict[str, list[Any]] = {
    "avcc_code": [
        "MA.156.1.2/x",
        "MA.156.1234567890.1234567890/" + "a" * 128,
        "MA.156.12345678901.1/x",
        "MA.156.1.2/" + "a" * 129,
        "MA.157.1.2/x",
        "ma.156.1.2/x",
        "MA.156.1.2/x y",
        "MA.156.1.2/x\n",
        "MA.156.1.2/é",
        "MA.156.1.2/a_b.c-d",
        "MA.156..2/x",
    ],
    "platform_node": [
        "1",
        "0",
        "1234567890123456",
        "12345678901234567",
        "12a",
        "-1",
        "\uff11\uff12",
    ],  # fullwidth digits
    "user_hash": [
        "sha256:" + "0" * 64,
        "sha256:" + "A" * 64,
        "sha256:" + "0" * 63,
        "sha256:" + "0" * 65,
        "SHA256:" + "0" * 64,
        "sha256:" + "g" * 64,
        "sha256:" + "0" * 64 + "\n",
    ],
    "event_type": ["play", "complete", "purchase", "PLAY", "view", "play "],
    "duration_sec": [0, MAX_DURATION_SEC, MAX_DURATION_SEC + 1, -1, 10.0, 2**63, "10"],
    "revenue_cny": [
        0,
        12,
        10**12 - 1,
        10**12,
        -1,
        0.0,
        -0.0,
        12.5,
        12.05,
        12.345,
        0.1,
        1e-05,
        999999999999.99,
        1e12,
        1e15,
        -12.5,
        "0",
        "0.00",
        "-0",
        "-0.00",
        "-0.01",
        "12.5",
        "12.50",
        "012.50",
        "12.345",
        "1e2",
        "+1",
        ".5",
        "5.",
        "1,5",
        "999999999999.99",
        "1000000000000",
        " 1",
        "\uff11",  # fullwidth digit
    ],
    "idempotency_id": [
        "ok-1",
        "a" * 128,
        "a" * 129,
        "has space",
        'quote"d',
        "back\\slash",
        "tab\t",
        "é",
        "!~",
    ],
}
ENVELOPE_VARIANTS: dict[str, list[Any]] = {
    "event_id": [
        str(uuid.uuid4()),
        "8F14E45F-CEEA-467A-9575-3B1B2B7E7A10",
        "8f14e45fceea467a95753b1b2b7e7a10",
        "{8f14e45f-ceea-467a-9575-3b1b2b7e7a10}",
        "8f14e45f-ceea-467a-9575-3b1b2b7e7a1",
        "8f14e45f-ceea-467a-9575-3b1b2b7e7a10\n",
        "urn:uuid:8f14e45f-ceea-467a-9575-3b1b2b7e7a10",
    ],
    "timestamp": [MIN_EPOCH_MS, MIN_EPOCH_MS - 1, MAX_EPOCH_MS - 1, MAX_EPOCH_MS, float(T0), str(T0), -T0],
    "source": ["gateway-svc", "g", "a" * 64, "a" * 65, "Gateway", "-gw", "gw_svc", "1gw", "gw\n"],
    "payload": [None, [], "x", 1],
}


def _cases() -> Iterator[tuple[str, Any]]:
    yield "valid", event()
    for name, values in PAYLOAD_VARIANTS.items():
        for value in [*values, *_COMMON_BAD]:
            yield f"payload.{name}={value!r}", event(**{name: value})
    for name, values in ENVELOPE_VARIANTS.items():
        for value in [*values, *_COMMON_BAD]:
            document = event()
            document[name] = value
            yield f"{name}={value!r}", document
    for name in [*event()["payload"], "idempotency_id"]:
        document = event(idempotency_id="x")
        del document["payload"][name]
        yield f"missing payload.{name}", document
    for name in event():
        document = event()
        del document[name]
        yield f"missing {name}", document
    extra = event()
    extra["extra"] = 1
    yield "extra envelope field", extra
    yield "extra payload field", event(extra=1)
    yield "extra + idempotency", event(extra=1, idempotency_id="x")


@pytest.mark.parametrize(("label", "document"), list(_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_fast_validator_matches_schema(label: str, document: Any) -> None:
    assert_same_verdict(document)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b"null",
        b'"string"',
        b"\xff\xfe",
        b'{"event_id": 1',
        orjson.dumps(event())[:-1],
        orjson.dumps(event()) + b" ",
        b'{"event_id":"8f14e45f-ceea-467a-9575-3b1b2b7e7a10","event_id":"x","timestamp":'
        + str(T0).encode()
        + b',"source":"gw","payload":'
        + orjson.dumps(event()["payload"])
        + b"}",
        orjson.dumps(event()).replace(b'"timestamp":1717312200000', b'"timestamp":1.7173122e12'),
        orjson.dumps(event()).replace(b'"duration_sec":1800', b'"duration_sec":1800.0'),
        orjson.dumps(event()).replace(b'"duration_sec":1800', b'"duration_sec":18446744073709551616'),
    ],
)
def test_fast_validator_matches_schema_on_raw_bytes(raw: bytes) -> None:
    assert_same_verdict(raw)


def test_fast_validator_matches_schema_on_random_mutations() -> None:
    rng = random.Random(20260602)
    pool: list[Any] = [*_COMMON_BAD]
    for values in (*PAYLOAD_VARIANTS.values(), *ENVELOPE_VARIANTS.values()):
        pool.extend(values)
    accepted = 0
    for _ in range(3000):
        document = event(idempotency_id=rng.choice([None, "id-1"]))
        if document["payload"]["idempotency_id"] is None and rng.random() < 0.5:
            del document["payload"]["idempotency_id"]
        for _ in range(rng.randint(0, 3)):
            target = document if rng.random() < 0.3 else document.get("payload")
            if not isinstance(target, dict):
                break
            key = rng.choice([*target, "extra"])
            if rng.random() < 0.1:
                target.pop(key, None)
            else:
                values = PAYLOAD_VARIANTS.get(key) or ENVELOPE_VARIANTS.get(key) or pool
                target[key] = copy.deepcopy(rng.choice(values if rng.random() < 0.7 else pool))
        if assert_same_verdict(document) is not None:
            accepted += 1
    assert 300 < accepted < 2700  # the sample exercises both verdicts


def test_fast_row_equals_the_model_row_for_every_money_form() -> None:
    for revenue, cents in [("12.5", 1250), (12.05, 1205), (7, 700), ("-0.00", 0), (-0.0, 0), ("0.01", 1)]:
        row = assert_same_verdict(event(revenue_cny=revenue, event_type="purchase"))
        assert row is not None
        assert row[8] == cents


def test_money_cents_agrees_with_parse_money() -> None:
    values: list[Any] = list(PAYLOAD_VARIANTS["revenue_cny"])
    rng = random.Random(7)
    values += [round(rng.uniform(0, 10_000), rng.randint(0, 3)) for _ in range(500)]
    values += [f"{rng.randint(0, 10**12 - 1)}.{rng.randint(0, 99):02d}" for _ in range(200)]
    for value in [*values, *values]:  # twice: the second pass hits the caches
        try:
            amount: Decimal | None = parse_money(value)
        except Exception:
            amount = None
        if amount is not None and amount < 0:
            amount = None
        expected = None if amount is None else int(amount * 100)
        assert money_cents(value) == expected, value


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
    other: dict[str, Any] = {"avcc_code": "MA.156.1.2/other", "event_type": "purchase", "revenue_cny": 0.05}
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


# --- the sink loop over the store (scripted consumer, no broker) -----------------------------------


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        self._topic, self._partition, self._offset, self._value = topic, partition, offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes:
        return b"k"

    def timestamp(self) -> tuple[int, int]:
        return (1, T0)

    def headers(self) -> None:
        return None


class FakeConsumer:
    """Serves scripted batches; records pause/resume/commit calls in ``log`` (shared with the backend)."""

    def __init__(self, batches: list[list[FakeMessage]], log: list[str]) -> None:
        self.batches = batches
        self.log = log
        self.paused = False
        self.on_revoke: Any = None

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        if self.paused or not self.batches:
            return []
        return self.batches.pop(0)

    def assignment(self) -> list[Any]:
        return ["tp"]

    def pause(self, partitions: Any) -> None:
        self.paused = True
        self.log.append("pause")

    def resume(self, partitions: Any) -> None:
        self.paused = False
        self.log.append("resume")

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        assert asynchronous is False
        self.log.append("commit " + ",".join(f"{tp.topic}/{tp.partition}@{tp.offset}" for tp in offsets))


class FlakyBackend:
    """Records inserts; the first ``failures`` inserts raise DependencyUnavailable."""

    description = "fake"
    supports_dedup_token = False

    def __init__(self, log: list[str], failures: int = 0) -> None:
        self.log = log
        self.failures = failures
        self.rows: list[tuple[Any, ...]] = []

    def insert_columns(self, table: str, names: Any, columns: Any, dedup_token: str | None = None) -> None:
        if self.failures:
            self.failures -= 1
            self.log.append(f"insert-failed {table}")
            raise DependencyUnavailable("ClickHouse is down")
        self.log.append(f"insert {table} {len(columns[0])}")
        self.rows.extend(zip(*columns, strict=True))


def _sink_loop(consumer: FakeConsumer, backend: FlakyBackend, letters: list[Any]) -> Any:
    from agents.sink import SinkConfig, SinkLoop, SinkTopics

    loop = SinkLoop(
        settings=None,  # type: ignore[arg-type]
        backend=backend,  # type: ignore[arg-type]
        dead_letter=letters.extend,
        config=SinkConfig(batch_max_rows=4, batch_max_seconds=60, backoff_initial_s=0.01, backoff_max_s=0.02),
        topics=SinkTopics("pb", "an", "dlq"),
        group_id="g",
    )
    loop._consumer = consumer
    return loop


def _valid(i: int) -> bytes:
    document = event()
    document["event_id"] = str(uuid.UUID(int=i, version=4))
    return orjson.dumps(document)


def test_sink_loop_commits_only_after_the_insert_and_pauses_through_an_outage() -> None:
    import threading

    log: list[str] = []
    letters: list[Any] = []
    batches = [
        [FakeMessage("pb", 0, 10, _valid(1)), FakeMessage("pb", 1, 5, b"garbage")],
        [FakeMessage("pb", 0, 11, _valid(2)), FakeMessage("pb", 0, 12, _valid(1))],
        [FakeMessage("pb", 1, 6, _valid(3))],
    ]
    consumer = FakeConsumer(batches, log)
    backend = FlakyBackend(log, failures=2)
    loop = _sink_loop(consumer, backend, letters)
    stop = threading.Event()
    loop._consume(0)
    loop._consume(0)  # 4 messages: the batch is full
    batch = loop._batch
    loop._flush_until_done(batch, stop)
    assert log == [
        "insert-failed playback_events",
        "pause",
        "insert-failed playback_events",
        "insert playback_events 2",  # event 1 redelivered inside the batch counts once
        "commit pb/0@13,pb/1@6",
        "resume",
    ]
    assert [letter.value for letter in letters] == [b"garbage"]  # sent once, not per retry
    assert letters[0].topic == "dlq"
    assert loop.stats.duplicates_in_batch == 1 and loop.stats.insert_failures == 2
    assert loop._batch is not batch and not loop.stats.paused


def test_sink_loop_drops_the_uncommitted_batch_on_revoke() -> None:
    log: list[str] = []
    consumer = FakeConsumer([[FakeMessage("pb", 0, 1, _valid(1))]], log)
    loop = _sink_loop(consumer, FlakyBackend(log), [])
    loop._consume(0)
    assert loop._batch.messages == 1
    loop._on_revoke(consumer, [])
    assert loop._batch.messages == 0 and loop.stats.dropped_on_revoke == 1
    assert log == []  # nothing inserted, nothing committed: the new owner gets the message again


# --- the sink's columnar fast path must agree with the per-document check ------------------
def _json_docs(documents: list[Any]) -> list[Any]:
    return [orjson.loads(orjson.dumps(d)) for d in documents]


def _assert_columns_agree(chunk: list[Any]) -> None:
    rows = [parse_playback(d) for d in chunk]
    got = playback_columns(chunk)
    if any(row is None for row in rows):
        assert got is None, chunk  # one refusal refuses the chunk (the sink re-checks one by one)
    elif got is not None:
        assert [tuple(r) for r in zip(*got, strict=True)] == rows


@pytest.mark.parametrize(("label", "document"), list(_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_columnar_check_agrees_with_parse_playback(label: str, document: Any) -> None:
    _assert_columns_agree(_json_docs([document]))


def test_columnar_check_agrees_on_random_chunks() -> None:
    rng = random.Random(11)
    docs = _json_docs([d for _, d in _cases()])
    docs += [orjson.loads(raw) for raw in (b"[1,2,3,4]", b'"abcd"', b"null", b"1.5", b"{}")]
    for bad in ("abcdef", list(range(6)), 7):
        document = event()
        document["payload"] = bad
        docs.append(document)
    for i in range(300):
        document = event(idempotency_id=rng.choice([None, "id-1", 'q"x', "b\\s"]))
        document["event_id"] = str(uuid.UUID(int=i, version=4))
        docs.extend(_json_docs([document]))
    for _ in range(5000):
        _assert_columns_agree(rng.sample(docs, rng.choice([1, 2, 5, 30])))
    valid = [d for d in docs[-300:] if parse_playback(d) is not None]
    assert playback_columns(valid) is not None  # gateway-shaped chunks take the fast path
