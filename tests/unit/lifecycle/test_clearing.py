"""Clearing of settlement instructions (pure): receipts move an instruction, cleared stays cleared."""

from __future__ import annotations

import uuid

import orjson

from app.lifecycle.chain.ledger import crd_address
from app.lifecycle.settlement.clearing import (
    EVENT_NS,
    Clearing,
    InstructionRequest,
    clearing_update,
    instruction_pending,
    is_duplicate,
)
from app.platform.topics import CHAIN_TX_PENDING
from schemas.chain import ChainTxConfirmed, ChainTxPending
from schemas.envelope import Envelope, make_envelope
from tests.unit.lifecycle.applications import SETTLEMENT_INSTRUCTION as INSTRUCTION


def receipt(status: str = "success") -> Envelope[ChainTxConfirmed]:
    payload = ChainTxConfirmed(
        avcc_record_id=10042,
        chain_type="settlement",
        tx_hash="0x" + "ef" * 32,
        block_height=9,
        status=status,  # type: ignore[arg-type]
        crd_address=crd_address("settlement"),
        idempotency_key="settlement-ins-202606-10042",
        instruction_id="ins-202606-10042",
        error="reverted" if status == "failed" else None,
    )
    return make_envelope(payload, source="chain-svc")


def test_failed_then_cleared_then_stays_cleared() -> None:
    failed, success, late_failure = receipt("failed"), receipt(), receipt("failed")
    first = clearing_update(None, failed, 1000)
    assert (first.status, first.error, first.instruction_id) == ("failed", "reverted", "ins-202606-10042")
    second = clearing_update(first, success, 2000)
    assert (second.status, second.error, second.updated_ms) == ("cleared", None, 2000)
    assert [(s.status, s.event_id) for s in second.history] == [
        ("failed", str(failed.event_id)),
        ("cleared", str(success.event_id)),
    ]
    third = clearing_update(second, late_failure, 3000)
    assert third.model_dump(exclude={"seen"}) == second.model_dump(exclude={"seen"})
    assert is_duplicate(third, late_failure) and is_duplicate(third, failed)
    assert not is_duplicate(None, failed)


def test_public_view_is_the_former_body() -> None:
    event = receipt()
    body = clearing_update(None, event, 1000).public()
    assert list(body) == [
        "instruction_id",
        "history",
        "avcc_record_id",
        "status",
        "tx_hash",
        "block_height",
        "error",
        "updated_ms",
    ]
    assert body["history"] == [{"at_ms": 1000, "status": "cleared", "event_id": str(event.event_id)}]


def test_states_stored_before_seen_existed_dedup_by_history() -> None:
    event = receipt()
    old = clearing_update(None, event, 1000).public()
    restored = Clearing.model_validate_json(orjson.dumps(old))
    assert is_duplicate(restored, event)


def test_instruction_becomes_a_settlement_transaction() -> None:
    request = InstructionRequest.model_validate(
        {"avcc_record_id": 10042, "request_id": "settle_1", "settlement": INSTRUCTION}
    )
    out = instruction_pending(request)
    assert out.topic == CHAIN_TX_PENDING and out.avcc_record_id == 10042
    tx = out.envelope.payload
    assert isinstance(tx, ChainTxPending)
    assert (tx.chain_type, tx.idempotency_key) == ("settlement", "settlement-ins-202606-10042")
    assert out.envelope.event_id == uuid.uuid5(EVENT_NS, "instruction:ins-202606-10042")
