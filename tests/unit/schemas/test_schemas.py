"""Contract tests of the ``schemas`` package: seed examples, rejections, money, codec, headers."""

from __future__ import annotations

import copy
import hashlib
import uuid
from decimal import Decimal
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from app.contract_docs.examples import load_examples
from app.platform import topics
from app.platform.contracts import PAYLOAD_MODELS, decode_event, payload_model, validate_event
from app.platform.errors import SchemaViolation, UndecodableMessage
from schemas import (
    AnomalyDetected,
    ApplyCreated,
    ChainTxConfirmed,
    ChainTxPending,
    Envelope,
    FailureMetadata,
    OrjsonCodec,
    PlaybackEvent,
    ReviewTaskFinished,
    decode_as,
    dumps,
    encode_event,
    encode_payload,
    envelope_class,
    header_name,
    loads,
    make_envelope,
    parse_money,
    register_codec,
)

EVENT_ID = "6f1c2a3e-8b4d-4c1e-9f7a-2d3b4c5e6f70"
TS = 1717312200000
CONTENT_HASH = "sha256:" + hashlib.sha256(b"works/raw/10042.mp4").hexdigest()
REPORT_HASH = "sha256:" + hashlib.sha256(b"review-report-5001").hexdigest()
USER_HASH = "sha256:" + hashlib.sha256(b"user123").hexdigest()
TX_HASH = "0x" + hashlib.sha256(b"tx").hexdigest()
CRD_ADDRESS = "0x7f3e9a" + "0" * 32 + "12"
MA_CODE = "MA.156.10005.8361/V2026.0602-000123"

APPLY = topics.APPLY_CREATED.name
REVIEW = topics.REVIEW_TASK_FINISHED.name
PENDING = topics.CHAIN_TX_PENDING.name
CONFIRMED = topics.CHAIN_TX_CONFIRMED.name
PLAYBACK = topics.PLAYBACK_EVENT.name
ANOMALY = topics.ANOMALY.name


def envelope(payload: dict[str, Any], source: str = "code-svc") -> dict[str, Any]:
    return {"event_id": EVENT_ID, "timestamp": TS, "source": source, "payload": payload}


#: The published examples (``schemas/examples``, also in the AsyncAPI document) are the test data.
EXAMPLES = load_examples()
SEED_PAYLOADS: dict[str, dict[str, Any]] = {
    topic: EXAMPLES[topic][0]["payload"]["payload"]
    for topic in (APPLY, REVIEW, PENDING, CONFIRMED, PLAYBACK, ANOMALY)
}
SETTLEMENT: dict[str, Any] = EXAMPLES[PENDING][1]["payload"]["payload"]


def raw_event(topic: str, **changes: Any) -> dict[str, Any]:
    """A valid wire event of ``topic`` with dotted-path ``changes`` (``...`` deletes the field)."""
    event = envelope(copy.deepcopy(SEED_PAYLOADS[topic]))
    for path, value in changes.items():
        set_path(event, path.replace("__", "."), value)
    return event


def set_path(event: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = event
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is ...:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def assert_violation(topic: str, event: dict[str, Any] | bytes, field: str) -> SchemaViolation:
    raw = event if isinstance(event, bytes) else orjson.dumps(event)
    with pytest.raises(SchemaViolation) as info:
        decode_event(topic, raw)
    exc = info.value
    assert field in exc.fields, (exc.fields, str(exc))
    message = str(exc)
    assert f"{field}: " in message
    assert "\n" not in message and "\r" not in message
    return exc


# --- seed examples ------------------------------------------------------------------------------


@pytest.mark.parametrize("topic", list(SEED_PAYLOADS))
def test_seed_example_validates_and_round_trips(topic: str) -> None:
    raw = orjson.dumps(envelope(SEED_PAYLOADS[topic]))
    env = decode_event(topic, raw)
    assert isinstance(env.payload, PAYLOAD_MODELS[topic])
    assert env.event_id == uuid.UUID(EVENT_ID)
    assert env.timestamp == TS
    again = encode_event(env)
    assert decode_event(topic, again) == env
    assert encode_event(decode_event(topic, again)) == again


def test_seed_payload_values_are_typed() -> None:
    apply = decode_as(ApplyCreated, orjson.dumps(envelope(SEED_PAYLOADS[APPLY])))
    assert apply.payload.ai_tool_info.model_name == "Stable-Diffusion-XL"
    assert apply.payload.priority == 5
    assert apply.payload.title is None
    review = decode_as(ReviewTaskFinished, orjson.dumps(envelope(SEED_PAYLOADS[REVIEW])))
    assert review.payload.overall_score == 78.5
    playback = decode_as(PlaybackEvent, orjson.dumps(envelope(SEED_PAYLOADS[PLAYBACK])))
    assert playback.payload.revenue_cny == Decimal("0.00")
    assert str(playback.payload.revenue_cny) == "0.00"


def test_seed_placeholder_ma_code_matches() -> None:
    event = raw_event(PLAYBACK, payload__avcc_code="MA.156.10005.8361/...")
    assert decode_as(PlaybackEvent, orjson.dumps(event)).payload.avcc_code.endswith("/...")


def test_optional_registry_fields_accepted() -> None:
    event = raw_event(
        APPLY,
        payload__title="山水之间",
        payload__applicant_id="user:88",
        payload__media_type="video",
    )
    env = decode_as(ApplyCreated, orjson.dumps(event))
    assert env.payload.media_type == "video"
    assert decode_event(APPLY, encode_event(env)) == env


def test_settlement_instruction_validates() -> None:
    env = decode_as(ChainTxPending, orjson.dumps(envelope(SETTLEMENT, "settlement-svc")))
    assert env.payload.settlement is not None
    assert env.payload.evidence is None
    assert env.payload.settlement.total_cny == Decimal("100.30")
    assert [s.amount_cny for s in env.payload.settlement.splits] == [
        Decimal("70.00"),
        Decimal("30.30"),
    ]
    assert decode_event(PENDING, encode_event(env)) == env


def test_confirmed_failed_settlement_receipt() -> None:
    event = raw_event(
        CONFIRMED,
        payload__chain_type="settlement",
        payload__status="failed",
        payload__error="out of gas",
        payload__instruction_id="ins-202606-10042",
        payload__idempotency_key="settle:10042:2026-06",
    )
    env = decode_as(ChainTxConfirmed, orjson.dumps(event))
    assert env.payload.error == "out of gas"


def test_tx_hash_accepts_mixed_case() -> None:
    event = raw_event(CONFIRMED, payload__tx_hash="0x" + "aBcD" * 16)
    assert decode_as(ChainTxConfirmed, orjson.dumps(event)).payload.tx_hash.startswith("0xaBcD")


def test_score_accepts_json_integer() -> None:
    env = decode_as(ReviewTaskFinished, orjson.dumps(raw_event(REVIEW, payload__overall_score=78)))
    assert env.payload.overall_score == 78.0


def test_validate_event_is_decode_event() -> None:
    assert validate_event is decode_event


# --- undecodable --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"{'a': 1}", b"\xff\xfe{}", b"[1, 2]", b'"text"', b"null", b"42", b"true", b"NaN"],
)
def test_malformed_json_is_undecodable(raw: bytes) -> None:
    with pytest.raises(UndecodableMessage) as info:
        decode_event(APPLY, raw)
    assert "\n" not in str(info.value)


def test_unknown_topic() -> None:
    with pytest.raises(SchemaViolation) as info:
        decode_event("topic.nope", orjson.dumps(envelope(SEED_PAYLOADS[APPLY])))
    assert info.value.fields == ("topic",)
    assert str(info.value).startswith("topic: unknown topic 'topic.nope'")
    with pytest.raises(SchemaViolation):
        payload_model(topics.DLQ.name)


def test_registry_covers_payload_topics_only() -> None:
    internal = {topics.CODE_REVIEW_FINISHED.name, topics.REVIEW_DECISIONS.name}
    assert set(PAYLOAD_MODELS) == {APPLY, REVIEW, PENDING, CONFIRMED, PLAYBACK, ANOMALY, *internal}
    assert topics.DLQ.name not in PAYLOAD_MODELS
    assert topics.RETRY.name not in PAYLOAD_MODELS
    assert payload_model(ANOMALY) is AnomalyDetected


# --- contract breaks ----------------------------------------------------------------------------

REJECTIONS: list[tuple[str, str, Any, str]] = [
    # envelope
    (APPLY, "event_id", "not-a-uuid", "event_id"),
    (APPLY, "event_id", EVENT_ID.upper(), "event_id"),
    (APPLY, "event_id", 42, "event_id"),
    (APPLY, "timestamp", str(TS), "timestamp"),
    (APPLY, "timestamp", TS // 1000, "timestamp"),
    (APPLY, "timestamp", True, "timestamp"),
    (APPLY, "source", "Code_Svc", "source"),
    (APPLY, "source", "", "source"),
    (APPLY, "payload", [], "payload"),
    (APPLY, "payload", ..., "payload"),
    (APPLY, "event_id", ..., "event_id"),
    (APPLY, "trace_id", "abc", "trace_id"),
    # apply.created
    (APPLY, "payload.priority", "5", "payload.priority"),
    (APPLY, "payload.priority", 10, "payload.priority"),
    (APPLY, "payload.priority", 5.5, "payload.priority"),
    (APPLY, "payload.avcc_record_id", float(2**53 + 2), "payload.avcc_record_id"),
    (APPLY, "payload.priority", True, "payload.priority"),
    (APPLY, "payload.avcc_record_id", "10042", "payload.avcc_record_id"),
    (APPLY, "payload.avcc_record_id", 0, "payload.avcc_record_id"),
    (APPLY, "payload.avcc_record_id", 2**63, "payload.avcc_record_id"),
    (APPLY, "payload.content_hash", "sha256:abc123def456...", "payload.content_hash"),
    (APPLY, "payload.content_hash", CONTENT_HASH.upper(), "payload.content_hash"),
    (APPLY, "payload.content_hash", CONTENT_HASH[7:], "payload.content_hash"),
    (APPLY, "payload.content_url", "ftp://host/works/a.mp4", "payload.content_url"),
    (APPLY, "payload.content_url", "s3://aigc-hub-storage", "payload.content_url"),
    (APPLY, "payload.content_url", "s3://aigc-hub-storage/", "payload.content_url"),
    (APPLY, "payload.content_url", "works/raw/a.mp4", "payload.content_url"),
    (APPLY, "payload.content_url", "https://u:p@host/a.mp4", "payload.content_url"),
    (APPLY, "payload.content_url", "https://host/" + "a" * 2048, "payload.content_url"),
    (APPLY, "payload.request_id", "req 1", "payload.request_id"),
    (APPLY, "payload.request_id", "", "payload.request_id"),
    (APPLY, "payload.ai_tool_info.model_name", "", "payload.ai_tool_info.model_name"),
    (APPLY, "payload.ai_tool_info.model_name", "   ", "payload.ai_tool_info.model_name"),
    (APPLY, "payload.ai_tool_info.model_version", "v" * 65, "payload.ai_tool_info.model_version"),
    (APPLY, "payload.ai_tool_info.seed", 1, "payload.ai_tool_info.seed"),
    (APPLY, "payload.ai_tool_info", "SDXL", "payload.ai_tool_info"),
    (APPLY, "payload.media_type", "image", "payload.media_type"),
    (APPLY, "payload.content_hash", ..., "payload.content_hash"),
    (APPLY, "payload.extra_field", 1, "payload.extra_field"),
    # review.task.finished
    (REVIEW, "payload.decision", "maybe", "payload.decision"),
    (REVIEW, "payload.final_level", "A", "payload.final_level"),
    (REVIEW, "payload.overall_score", "78.5", "payload.overall_score"),
    (REVIEW, "payload.overall_score", True, "payload.overall_score"),
    (REVIEW, "payload.overall_score", 100.01, "payload.overall_score"),
    (REVIEW, "payload.overall_score", -0.5, "payload.overall_score"),
    (REVIEW, "payload.report_hash", "sha256:789ghi...", "payload.report_hash"),
    (REVIEW, "payload.review_report_id", -1, "payload.review_report_id"),
    # chain.tx.confirmed
    (CONFIRMED, "payload.tx_hash", "0xabc123...", "payload.tx_hash"),
    (CONFIRMED, "payload.crd_address", "0x7f3e9a...", "payload.crd_address"),
    (CONFIRMED, "payload.block_height", -1, "payload.block_height"),
    (CONFIRMED, "payload.status", "pending", "payload.status"),
    (CONFIRMED, "payload.chain_type", "sidechain", "payload.chain_type"),
    (CONFIRMED, "payload.error", "boom", "payload.error"),
    (CONFIRMED, "payload.instruction_id", "ins-1", "payload.instruction_id"),
    # playback.event
    (PLAYBACK, "payload.user_hash", "sha256:user123", "payload.user_hash"),
    (PLAYBACK, "payload.duration_sec", -1, "payload.duration_sec"),
    (PLAYBACK, "payload.duration_sec", 8 * 24 * 3600, "payload.duration_sec"),
    (PLAYBACK, "payload.duration_sec", 1.5, "payload.duration_sec"),
    (PLAYBACK, "payload.event_type", "pause", "payload.event_type"),
    (PLAYBACK, "payload.platform_node", "node-1", "payload.platform_node"),
    (PLAYBACK, "payload.platform_node", 8361, "payload.platform_node"),
    (PLAYBACK, "payload.avcc_code", "MA.157.10005.8361/x", "payload.avcc_code"),
    (PLAYBACK, "payload.avcc_code", "MA.156.10005.8361/has space", "payload.avcc_code"),
    (PLAYBACK, "payload.idempotency_id", "has space", "payload.idempotency_id"),
    (PLAYBACK, "payload.revenue_cny", 0.1 + 0.2, "payload.revenue_cny"),
    (PLAYBACK, "payload.revenue_cny", 1.005, "payload.revenue_cny"),
    (PLAYBACK, "payload.revenue_cny", 1e-5, "payload.revenue_cny"),
    (PLAYBACK, "payload.revenue_cny", "12.345", "payload.revenue_cny"),
    (PLAYBACK, "payload.revenue_cny", "1e3", "payload.revenue_cny"),
    (PLAYBACK, "payload.revenue_cny", "abc", "payload.revenue_cny"),
    (PLAYBACK, "payload.revenue_cny", -0.01, "payload.revenue_cny"),
    (PLAYBACK, "payload.revenue_cny", True, "payload.revenue_cny"),
    (PLAYBACK, "payload.revenue_cny", None, "payload.revenue_cny"),
    (PLAYBACK, "payload.revenue_cny", 1e12, "payload.revenue_cny"),
    # chain.tx.pending
    (PENDING, "payload.evidence", ..., "payload.evidence"),
    (PENDING, "payload.settlement", SETTLEMENT["settlement"], "payload.settlement"),
    (PENDING, "payload.idempotency_key", "", "payload.idempotency_key"),
    (PENDING, "payload.evidence.final_level", "X", "payload.evidence.final_level"),
    (PENDING, "payload.evidence.report_hash", "sha256:", "payload.evidence.report_hash"),
    # playback.anomaly
    (ANOMALY, "payload.rule", "unknown_rule", "payload.rule"),
    (ANOMALY, "payload.window_end_ms", TS - 1, "payload.window_end_ms"),
    (ANOMALY, "payload.observed", -1, "payload.observed"),
    (ANOMALY, "payload.evidence.flag", True, "payload.evidence.flag"),
    (ANOMALY, "payload.evidence.nested", {"a": 1}, "payload.evidence.nested"),
]


@pytest.mark.parametrize(("topic", "path", "value", "field"), REJECTIONS)
def test_contract_break_names_the_field(topic: str, path: str, value: Any, field: str) -> None:
    event = raw_event(topic)
    set_path(event, path, value)
    assert_violation(topic, event, field)


def test_message_matches_brief_example() -> None:
    event = raw_event(APPLY, payload__content_hash="sha256:abc")
    exc = assert_violation(APPLY, event, "payload.content_hash")
    assert str(exc) == ("payload.content_hash: must be 'sha256:' followed by 64 lowercase hex digits")
    assert exc.fields == ("payload.content_hash",)


def test_wrong_type_message_names_json_type() -> None:
    exc = assert_violation(APPLY, raw_event(APPLY, payload__priority="5"), "payload.priority")
    assert str(exc) == "payload.priority: must be a valid integer (got string)"


def test_missing_and_extra_fields_reported_together() -> None:
    event = raw_event(APPLY, payload__priority=..., payload__colour="red")
    exc = assert_violation(APPLY, event, "payload.priority")
    assert exc.fields == ("payload.priority", "payload.colour")
    assert str(exc) == "payload.priority: required field missing; payload.colour: unexpected field"


def test_hostile_field_names_stay_on_one_line() -> None:
    event = raw_event(APPLY)
    event["payload"]["a\nb"] = 1
    exc = assert_violation(APPLY, event, "payload.a\\nb")
    assert "\n" not in str(exc)


def test_many_errors_are_capped_in_message_but_all_listed_in_fields() -> None:
    event = raw_event(APPLY)
    for i in range(50):
        event["payload"][f"x{i}"] = i
    exc = assert_violation(APPLY, event, "payload.x0")
    assert len(exc.fields) == 50
    assert "... and 30 more fields" in str(exc)


# --- chain.tx.pending rules ---------------------------------------------------------------------


def settlement_event(**changes: Any) -> dict[str, Any]:
    event = envelope(copy.deepcopy(SETTLEMENT), "settlement-svc")
    for path, value in changes.items():
        set_path(event, path.replace("__", "."), value)
    return event


def test_splits_must_sum_to_total() -> None:
    event = settlement_event(payload__settlement__total_cny="100.31")
    exc = assert_violation(PENDING, event, "payload.settlement.splits")
    assert "total_cny" in str(exc) and "100.30" in str(exc) and "100.31" in str(exc)


def test_splits_sum_is_exact_and_cents_are_strings() -> None:
    splits = [
        {"party": "a", "address": CRD_ADDRESS, "amount_cny": "0.10"},
        {"party": "b", "address": CRD_ADDRESS, "amount_cny": "0.2"},
    ]
    event = settlement_event(payload__settlement__total_cny="0.3", payload__settlement__splits=splits)
    env = decode_as(ChainTxPending, orjson.dumps(event))
    assert env.payload.settlement is not None
    assert env.payload.settlement.total_cny == Decimal("0.30")
    splits[0]["amount_cny"] = 0.1  # a JSON number with cents: its decimals cannot be checked
    exc = assert_violation(PENDING, event, "payload.settlement.splits.0.amount_cny")
    assert "must be whole" in str(exc)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"payload__settlement__splits": []}, "payload.settlement.splits"),
        ({"payload__settlement__currency": "USD"}, "payload.settlement.currency"),
        ({"payload__settlement__period_end": TS - 1}, "payload.settlement.period_end"),
        ({"payload__settlement__splits__1__party": "creator"}, "payload.settlement.splits"),
        ({"payload__settlement__splits__0__address": "0x12"}, "payload.settlement.splits.0.address"),
        ({"payload__settlement__splits__0__amount_cny": -70.1}, "payload.settlement.splits.0.amount_cny"),
        ({"payload__settlement__avcc_code": "MA.156/x"}, "payload.settlement.avcc_code"),
        ({"payload__settlement": ...}, "payload.settlement"),
        ({"payload__chain_type": "copyright_main"}, "payload.settlement"),
    ],
)
def test_settlement_rules(changes: dict[str, Any], field: str) -> None:
    assert_violation(PENDING, settlement_event(**changes), field)


def test_pending_with_both_parts_names_the_extra_one() -> None:
    event = raw_event(PENDING, payload__settlement=copy.deepcopy(SETTLEMENT["settlement"]))
    exc = assert_violation(PENDING, event, "payload.settlement")
    assert "copyright_main" in str(exc)
    assert "payload.evidence" not in exc.fields


# --- money --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "exact"),
    [
        (0, "0.00"),
        (7, "7.00"),
        (0.0, "0.00"),
        (-0.0, "0.00"),
        (12.0, "12.00"),
        (1e3, "1000.00"),
        ("12.5", "12.50"),
        ("12.50", "12.50"),
        ("0", "0.00"),
        ("-0.00", "0.00"),
        (999999999999.0, "999999999999.00"),
        ("999999999999.99", "999999999999.99"),
    ],
)
def test_money_is_exact_and_written_with_two_decimals(wire: Any, exact: str) -> None:
    event = raw_event(PLAYBACK, payload__event_type="purchase", payload__revenue_cny=wire)
    env = decode_as(PlaybackEvent, orjson.dumps(event))
    assert env.payload.revenue_cny == Decimal(exact)
    assert str(env.payload.revenue_cny) == exact
    wire_out = orjson.loads(encode_event(env))
    assert wire_out["payload"]["revenue_cny"] == exact
    assert decode_event(PLAYBACK, encode_event(env)) == env


@pytest.mark.parametrize("wire", [12.5, 0.07, 70.1, 99999999999.99, 1.005, 0.1 + 0.2, 1e-5])
def test_money_numbers_with_a_fraction_are_refused(wire: float) -> None:
    """A JSON number is a binary float: whether ``0.07`` was written with 2 decimals is beyond
    every JSON Schema validator (``multipleOf: 0.01`` refuses 0.07), so cents travel as strings."""
    event = raw_event(PLAYBACK, payload__event_type="purchase", payload__revenue_cny=wire)
    exc = assert_violation(PLAYBACK, event, "payload.revenue_cny")
    assert "give cents as a decimal string like '12.50'" in str(exc)


def test_integers_written_as_whole_numbers_are_integers() -> None:
    event = raw_event(APPLY, payload__priority=5.0, payload__avcc_record_id=1.0042e4)
    event["timestamp"] = float(TS)
    env = decode_as(ApplyCreated, orjson.dumps(event))
    assert (env.payload.priority, env.payload.avcc_record_id, env.timestamp) == (5, 10042, TS)
    assert orjson.loads(encode_event(env))["payload"]["priority"] == 5


def test_parse_money_signed_and_decimal_inputs() -> None:
    assert parse_money("-12.5") == Decimal("-12.50")
    assert parse_money(Decimal("1.100")) == Decimal("1.10")
    bad: object
    for bad in (Decimal("1.001"), Decimal("NaN"), float("inf"), [], 0.1 + 0.2):
        with pytest.raises(ValueError):
            parse_money(bad)


def test_money_model_dump_python_keeps_decimal() -> None:
    env = decode_as(PlaybackEvent, orjson.dumps(raw_event(PLAYBACK, payload__revenue_cny="3.3")))
    assert env.payload.model_dump()["revenue_cny"] == Decimal("3.30")
    assert orjson.loads(encode_payload(env.payload))["revenue_cny"] == "3.30"


# --- envelope construction ----------------------------------------------------------------------


def test_make_envelope_and_encode() -> None:
    payload = PlaybackEvent.model_validate(SEED_PAYLOADS[PLAYBACK])
    env = make_envelope(payload, source="gateway-svc")
    assert type(env) is envelope_class(PlaybackEvent)
    assert isinstance(env.event_id, uuid.UUID)
    wire = orjson.loads(encode_event(env))
    assert wire["event_id"] == str(env.event_id)
    assert wire["payload"]["revenue_cny"] == "0.00"
    assert "idempotency_id" not in wire["payload"]  # None fields are omitted
    assert decode_event(PLAYBACK, encode_event(env)) == env


def test_bare_envelope_serializes_full_payload() -> None:
    payload = PlaybackEvent.model_validate(SEED_PAYLOADS[PLAYBACK])
    env: Envelope[PlaybackEvent] = Envelope(
        event_id=uuid.UUID(EVENT_ID), timestamp=TS, source="gateway-svc", payload=payload
    )
    assert decode_event(PLAYBACK, encode_event(env)).payload == payload


def test_models_are_strict_and_frozen() -> None:
    with pytest.raises(ValidationError):
        ApplyCreated.model_validate({**SEED_PAYLOADS[APPLY], "priority": "5"})
    payload = ApplyCreated.model_validate(SEED_PAYLOADS[APPLY])
    with pytest.raises(ValidationError):
        payload.priority = 1


# --- codec --------------------------------------------------------------------------------------


def test_codec_round_trip_and_errors() -> None:
    assert loads(dumps({"a": Decimal("1.50"), "b": [1, "x"]})) == {"a": "1.50", "b": [1, "x"]}
    payload = PlaybackEvent.model_validate(SEED_PAYLOADS[PLAYBACK])
    assert loads(dumps(payload))["revenue_cny"] == "0.00"
    with pytest.raises(UndecodableMessage):
        loads(b"[]")
    with pytest.raises(UndecodableMessage):
        loads(b"\x00")
    with pytest.raises(TypeError):
        dumps({"a": object()})


def test_faust_codec_registration_is_idempotent() -> None:
    import faust.serializers.codecs as faust_codecs

    register_codec()
    first = faust_codecs.get_codec("orjson")
    register_codec()
    assert faust_codecs.get_codec("orjson") is first
    assert isinstance(first, OrjsonCodec)
    assert first.loads(first.dumps({"x": 1})) == {"x": 1}
    with pytest.raises(UndecodableMessage):
        first.loads(b"1")


# --- failure metadata ---------------------------------------------------------------------------


def failure(**changes: Any) -> FailureMetadata:
    fields: dict[str, Any] = {
        "original_topic": APPLY,
        "original_partition": 3,
        "original_offset": 981,
        "original_timestamp_ms": TS,
        "original_key": "10042",
        "consumer_group": "review-svc",
        "attempt": 2,
        "first_failure_ms": TS + 1000,
        "last_failure_ms": TS + 9000,
        "error_class": "app.platform.errors.DependencyTimeout",
        "error_message": "ClickHouse did not answer in 5 s",
        "not_before_ms": TS + 60_000,
        "stacktrace": "Traceback (most recent call last):\n  ...",
        "event_id": EVENT_ID,
    }
    fields.update(changes)
    return FailureMetadata.model_validate(fields)


def test_failure_headers_round_trip() -> None:
    meta = failure()
    headers = meta.to_headers()
    names = [name for name, _ in headers]
    assert all(name.startswith("avcc-") for name in names)
    assert ("avcc-original-topic", APPLY.encode()) in headers
    assert ("avcc-attempt", b"2") in headers
    assert header_name("reinjected_count") == "avcc-reinjected-count"
    foreign = [("traceparent", b"00-abc"), *headers]
    assert FailureMetadata.from_headers(foreign) == meta
    assert FailureMetadata.from_headers(dict(headers)) == meta
    assert FailureMetadata.model_validate(loads(dumps(meta))) == meta


def test_failure_headers_omit_none() -> None:
    meta = failure(original_key=None, not_before_ms=None, stacktrace=None, event_id=None)
    names = {name for name, _ in meta.to_headers()}
    assert "avcc-original-key" not in names and "avcc-not-before-ms" not in names
    assert FailureMetadata.from_headers(meta.to_headers()) == meta


def test_failure_long_texts_are_truncated() -> None:
    meta = failure(error_message="x" * 10_000, stacktrace="y" * 100_000)
    assert len(meta.error_message) == 2048 and meta.error_message.endswith("[truncated]")
    assert meta.stacktrace is not None and len(meta.stacktrace) == 16384
    assert FailureMetadata.from_headers(meta.to_headers()) == meta


def test_failure_bad_headers_name_the_header() -> None:
    headers = dict(failure().to_headers())
    headers["avcc-attempt"] = b"zero"
    with pytest.raises(SchemaViolation) as info:
        FailureMetadata.from_headers(headers)
    assert info.value.fields == ("headers.avcc-attempt",)
    del headers["avcc-attempt"]
    headers["avcc-original-offset"] = b"\xff"
    with pytest.raises(SchemaViolation) as info:
        FailureMetadata.from_headers(headers)
    assert info.value.fields == ("headers.avcc-original-offset",)
    with pytest.raises(SchemaViolation) as info:
        FailureMetadata.from_headers({})
    assert "headers.avcc-original-topic" in info.value.fields


def test_failure_order_rule() -> None:
    with pytest.raises(ValidationError):
        failure(last_failure_ms=TS)


def test_make_envelope_bad_source_is_schema_violation() -> None:
    payload = PlaybackEvent.model_validate(SEED_PAYLOADS[PLAYBACK])
    with pytest.raises(SchemaViolation) as info:
        make_envelope(payload, source="Gateway Svc")
    assert info.value.fields == ("source",)


def test_failure_headers_accept_text_values() -> None:
    meta = failure()
    text_headers = [(name, value.decode()) for name, value in meta.to_headers()]
    assert FailureMetadata.from_headers(text_headers) == meta
