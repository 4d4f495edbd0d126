"""Property tests of ``schemas``: valid events round-trip; garbage only raises the two contract errors."""

from __future__ import annotations

import copy
import uuid
from decimal import Decimal
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.platform import topics
from app.platform.contracts import PAYLOAD_MODELS, decode_event
from app.platform.errors import SchemaViolation, UndecodableMessage
from schemas import FailureMetadata, encode_event, envelope_class
from schemas.types import MAX_EPOCH_MS, MIN_EPOCH_MS

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOPICS = sorted(PAYLOAD_MODELS)

# --- valid wire values --------------------------------------------------------------------------

hex_chars = "0123456789abcdef"
sha256_refs = st.text(hex_chars, min_size=64, max_size=64).map(lambda h: "sha256:" + h)
mixed_hex = st.text("0123456789abcdefABCDEF", min_size=1, max_size=1)
tx_hashes = st.lists(mixed_hex, min_size=64, max_size=64).map(lambda cs: "0x" + "".join(cs))
addresses = st.lists(mixed_hex, min_size=40, max_size=40).map(lambda cs: "0x" + "".join(cs))
identifiers = st.from_regex(r"[A-Za-z0-9_.:-]{1,40}", fullmatch=True)
tokens = st.from_regex(r"[!-~]{1,40}", fullmatch=True)
non_blank = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != "")
ma_codes = st.builds(
    lambda issuer, node, suffix: f"MA.156.{issuer}.{node}/{suffix}",
    st.integers(0, 9_999_999_999),
    st.integers(0, 9_999_999_999),
    st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True),
)
record_ids = st.integers(1, 2**63 - 1)
epoch_ms = st.integers(MIN_EPOCH_MS, MAX_EPOCH_MS - 1)
uuids = st.uuids().map(str)
sources = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)
content_urls = st.one_of(
    st.builds(
        lambda scheme, host, path: f"{scheme}://{host}/{path}",
        st.sampled_from(["s3", "oss", "http", "https"]),
        st.from_regex(r"[a-z0-9.-]{1,30}", fullmatch=True),
        st.from_regex(r"[A-Za-z0-9/_.%-]{1,60}", fullmatch=True),
    ),
    st.from_regex(r"[A-Za-z0-9]{10,59}", fullmatch=True).map(lambda cid: f"ipfs://{cid}"),
)
finite = st.floats(allow_nan=False, allow_infinity=False)


def cents(max_value: str = "999999999999.99") -> st.SearchStrategy[Decimal]:
    return st.decimals(min_value=Decimal(0), max_value=Decimal(max_value), places=2)


def money_on_wire(amount: Decimal) -> st.SearchStrategy[Any]:
    """The forms a producer may send for ``amount``: string, and int or float if whole."""
    forms: list[Any] = [f"{amount:.2f}", str(amount.normalize()) if amount else "0"]
    if amount == amount.to_integral_value():
        forms.extend([int(amount), float(amount)])
    return st.sampled_from([f for f in forms if "E" not in str(f)])


money = cents().flatmap(money_on_wire)


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def without_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


apply_payloads = st.fixed_dictionaries(
    {
        "request_id": identifiers,
        "avcc_record_id": record_ids,
        "content_url": content_urls,
        "content_hash": sha256_refs,
        "ai_tool_info": st.fixed_dictionaries({"model_name": non_blank, "model_version": non_blank}),
        "priority": st.integers(0, 9),
        "title": optional(st.text(min_size=1, max_size=60)),
        "applicant_id": optional(identifiers),
        "media_type": optional(st.sampled_from(["audio", "video"])),
    }
).map(without_none)

review_payloads = st.fixed_dictionaries(
    {
        "request_id": identifiers,
        "avcc_record_id": record_ids,
        "review_report_id": record_ids,
        "decision": st.sampled_from(["approved", "rejected", "need_human"]),
        "final_level": st.sampled_from(["P", "G", "O"]),
        "overall_score": st.one_of(st.floats(0.0, 100.0, allow_nan=False), st.integers(0, 100)),
        "report_hash": sha256_refs,
    }
)

evidence_parts = st.fixed_dictionaries(
    {
        "content_hash": sha256_refs,
        "report_hash": sha256_refs,
        "final_level": st.sampled_from(["P", "G", "O"]),
        "review_report_id": record_ids,
        "applicant_id": optional(identifiers),
    }
).map(without_none)


@st.composite
def settlement_parts(draw: st.DrawFn) -> dict[str, Any]:
    amounts = draw(st.lists(cents("1000000"), min_size=1, max_size=5))
    parties = draw(st.lists(non_blank, min_size=len(amounts), max_size=len(amounts), unique=True))
    start = draw(st.integers(MIN_EPOCH_MS, MAX_EPOCH_MS - 1))
    total = sum(amounts, Decimal("0.00"))
    return {
        "instruction_id": draw(identifiers),
        "avcc_code": draw(ma_codes),
        "period_start": start,
        "period_end": draw(st.integers(start, MAX_EPOCH_MS - 1)),
        "currency": "CNY",
        "total_cny": draw(money_on_wire(total)),
        "splits": [
            {"party": party, "address": draw(addresses), "amount_cny": draw(money_on_wire(amount))}
            for party, amount in zip(parties, amounts, strict=True)
        ],
    }


@st.composite
def pending_payloads(draw: st.DrawFn) -> dict[str, Any]:
    chain_type = draw(st.sampled_from(["copyright_main", "settlement"]))
    payload: dict[str, Any] = {
        "avcc_record_id": draw(record_ids),
        "chain_type": chain_type,
        "idempotency_key": draw(identifiers),
        "request_id": draw(identifiers),
    }
    if chain_type == "copyright_main":
        payload["evidence"] = draw(evidence_parts)
    else:
        payload["settlement"] = draw(settlement_parts())
    return payload


@st.composite
def confirmed_payloads(draw: st.DrawFn) -> dict[str, Any]:
    chain_type = draw(st.sampled_from(["copyright_main", "settlement"]))
    status = draw(st.sampled_from(["success", "failed"]))
    payload: dict[str, Any] = {
        "avcc_record_id": draw(record_ids),
        "chain_type": chain_type,
        "tx_hash": draw(tx_hashes),
        "block_height": draw(st.integers(0, 2**63 - 1)),
        "status": status,
        "crd_address": draw(addresses),
        "idempotency_key": draw(optional(identifiers)),
    }
    if chain_type == "settlement":
        payload["instruction_id"] = draw(optional(identifiers))
    if status == "failed":
        payload["error"] = draw(optional(st.text(min_size=1, max_size=60)))
    return without_none(payload)


playback_payloads = st.fixed_dictionaries(
    {
        "avcc_code": ma_codes,
        "platform_node": st.from_regex(r"[0-9]{1,16}", fullmatch=True),
        "user_hash": sha256_refs,
        "event_type": st.sampled_from(["play", "complete", "purchase"]),
        "duration_sec": st.integers(0, 7 * 24 * 3600),
        "revenue_cny": money,
        "idempotency_id": optional(tokens),
    }
).map(without_none)


@st.composite
def anomaly_payloads(draw: st.DrawFn) -> dict[str, Any]:
    start = draw(epoch_ms)
    evidence_values = st.one_of(st.text(max_size=20), st.integers(-(2**63), 2**63 - 1), finite)
    return without_none(
        {
            "anomaly_id": draw(tokens),
            "rule": draw(
                st.sampled_from(
                    [
                        "traffic_spike",
                        "user_replay",
                        "impossible_duration",
                        "revenue_out_of_bounds",
                        "node_share_jump",
                    ]
                )
            ),
            "avcc_code": draw(optional(ma_codes)),
            "platform_node": draw(optional(st.from_regex(r"[0-9]{1,16}", fullmatch=True))),
            "user_hash": draw(optional(sha256_refs)),
            "window_start_ms": start,
            "window_end_ms": draw(st.integers(start, MAX_EPOCH_MS - 1)),
            "observed": draw(st.floats(0.0, 1e12, allow_nan=False)),
            "baseline": draw(optional(st.floats(0.0, 1e12, allow_nan=False))),
            "threshold": draw(finite),
            "evidence": draw(st.dictionaries(st.text(max_size=10), evidence_values, max_size=5)),
        }
    )


human_decisions = st.fixed_dictionaries(
    {
        "decision": st.sampled_from(["approve", "reject"]),
        "final_level": st.sampled_from(["P", "G", "O"]),
        "reviewer": identifiers,
        "reason": st.text(min_size=1, max_size=80),
        "avcc_record_id": record_ids,
        "decision_id": identifiers,
    }
)


PAYLOADS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    topics.APPLY_CREATED.name: apply_payloads,
    topics.REVIEW_TASK_FINISHED.name: review_payloads,
    topics.CHAIN_TX_PENDING.name: pending_payloads(),
    topics.CHAIN_TX_CONFIRMED.name: confirmed_payloads(),
    topics.PLAYBACK_EVENT.name: playback_payloads,
    topics.ANOMALY.name: anomaly_payloads(),
    topics.CODE_REVIEW_FINISHED.name: review_payloads,
    topics.REVIEW_DECISIONS.name: human_decisions,
}


@st.composite
def wire_events(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    topic = draw(st.sampled_from(TOPICS))
    event = {
        "event_id": draw(uuids),
        "timestamp": draw(epoch_ms),
        "source": draw(sources),
        "payload": draw(PAYLOADS[topic]),
    }
    return topic, event


def test_every_payload_topic_has_a_strategy() -> None:
    assert set(PAYLOADS) == set(PAYLOAD_MODELS)


@SETTINGS
@given(wire_events())
def test_valid_events_decode_and_round_trip(item: tuple[str, dict[str, Any]]) -> None:
    topic, event = item
    env = decode_event(topic, orjson.dumps(event))
    assert env.event_id == uuid.UUID(event["event_id"])
    wire = encode_event(env)
    assert decode_event(topic, wire) == env
    assert encode_event(decode_event(topic, wire)) == wire


@settings(SETTINGS, max_examples=100)
@given(wire_events())
def test_models_round_trip_from_python(item: tuple[str, dict[str, Any]]) -> None:
    topic, event = item
    env = envelope_class(PAYLOAD_MODELS[topic]).model_validate(event)
    assert decode_event(topic, encode_event(env)) == env


# --- garbage in, contract errors out ------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | finite | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=8,
)


def decode_or_contract_error(topic: str, raw: bytes) -> None:
    try:
        decode_event(topic, raw)
    except (UndecodableMessage, SchemaViolation) as exc:
        assert "\n" not in str(exc)
        if isinstance(exc, SchemaViolation):
            assert exc.fields


@SETTINGS
@given(st.sampled_from(TOPICS), st.binary(max_size=200))
def test_random_bytes_only_raise_contract_errors(topic: str, raw: bytes) -> None:
    decode_or_contract_error(topic, raw)


@SETTINGS
@given(st.sampled_from(TOPICS), json_values)
def test_random_json_only_raises_contract_errors(topic: str, value: Any) -> None:
    decode_or_contract_error(topic, orjson.dumps(value))


@SETTINGS
@given(st.sampled_from(TOPICS), st.dictionaries(st.text(max_size=10), json_values, max_size=4))
def test_random_envelope_payload_only_raises_contract_errors(topic: str, payload: Any) -> None:
    event = {"event_id": str(uuid.uuid4()), "timestamp": MIN_EPOCH_MS, "source": "x", "payload": payload}
    decode_or_contract_error(topic, orjson.dumps(event))


def _paths(node: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found: list[tuple[str | int, ...]] = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(_paths(value, (*prefix, index)))
    return found


@SETTINGS
@given(wire_events(), st.data())
def test_mutated_events_only_raise_contract_errors(
    item: tuple[str, dict[str, Any]], data: st.DataObject
) -> None:
    topic, event = item
    event = copy.deepcopy(event)
    path = data.draw(st.sampled_from(_paths(event)))
    parent: Any = event
    for part in path[:-1]:
        parent = parent[part]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(json_values)
    decode_or_contract_error(topic, orjson.dumps(event))


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["avcc-attempt", "avcc-original-topic", "avcc-original-offset", "x"]),
            st.one_of(st.none(), st.binary(max_size=20)),
        ),
        max_size=6,
    )
)
def test_random_failure_headers_only_raise_schema_violation(
    headers: list[tuple[str, bytes | None]],
) -> None:
    try:
        FailureMetadata.from_headers(headers)
    except SchemaViolation as exc:
        assert exc.fields
