"""Sink contract checks: the fast validator (per document and per chunk) equals the schema."""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import orjson
import pytest

from app.platform.contracts import decode_event
from app.platform.errors import NON_RETRIABLE
from app.platform.topics import PLAYBACK_EVENT
from app.playback.sink.checks import money_cents, parse_playback, playback_columns, playback_row
from schemas import parse_money
from schemas.playback import MAX_DURATION_SEC, PlaybackEvent
from schemas.types import MAX_EPOCH_MS, MIN_EPOCH_MS
from tests.unit.playback.playback_documents import T0, event


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
    for revenue, cents in [("12.5", 1250), (12.0, 1200), (7, 700), ("-0.00", 0), (-0.0, 0), ("0.01", 1)]:
        row = assert_same_verdict(event(revenue_cny=revenue, event_type="purchase"))
        assert row is not None
        assert row[8] == cents
    assert assert_same_verdict(event(revenue_cny=12.05, event_type="purchase")) is None


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


# --- the sink's columnar fast path must agree with the per-document check ------------------
def _json_docs(documents: list[Any]) -> list[Any]:
    return [orjson.loads(orjson.dumps(d)) for d in documents]


def _has_numeric_revenue(chunk: list[Any]) -> bool:
    """The one documented refusal of a valid chunk: a JSON-number ``revenue_cny`` is left to the
    per-document check (``playback_columns``: "numbers: the per-document check decides")."""
    return any(type(document["payload"]["revenue_cny"]) is not str for document in chunk)


def _assert_columns_agree(chunk: list[Any]) -> None:
    rows = [parse_playback(d) for d in chunk]
    got = playback_columns(chunk)
    if any(row is None for row in rows):
        assert got is None, chunk  # one refusal refuses the chunk (the sink re-checks one by one)
    elif got is None:
        # Every document is valid: the fast path may refuse only for its documented reason.
        assert _has_numeric_revenue(chunk), f"fast path refused a valid chunk: {chunk}"
    else:
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
