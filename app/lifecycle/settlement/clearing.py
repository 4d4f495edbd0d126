"""Clearing of settlement instructions: submitted as chain transactions, cleared by their receipts.

An instruction (``POST /v1/settlement/instructions``) becomes a ``chain.tx.pending`` of chain type
``settlement`` (:func:`instruction_pending`); each receipt on ``chain.tx.confirmed`` moves the
instruction's :class:`Clearing` to ``cleared`` or ``failed`` (:func:`clearing_update`). A
cleared instruction stays cleared.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from pydantic import BaseModel, Field, model_validator

from app.platform.faust.dedup import SeenEvents
from app.platform.faust.effects import Outgoing
from app.platform.topics import CHAIN_TX_CONFIRMED, CHAIN_TX_PENDING
from schemas.chain import ChainTxConfirmed, ChainTxPending, SettlementInstruction
from schemas.envelope import Envelope, make_envelope
from schemas.types import ContractModel, Identifier, RecordId

__all__ = [
    "EVENT_NS",
    "SEEN",
    "Clearing",
    "ClearingStep",
    "InstructionRequest",
    "clearing_update",
    "instruction_pending",
    "is_duplicate",
]

EVENT_NS: Final = uuid.UUID("c3a1e6d2-51f4-4f0e-9a7b-1d2e3f4a5b61")
#: Receipts already applied to an instruction, kept as long as chain.tx.confirmed keeps them.
SEEN = SeenEvents.for_inputs(CHAIN_TX_CONFIRMED)


class InstructionRequest(ContractModel):
    """Body of ``POST /v1/settlement/instructions``."""

    avcc_record_id: RecordId
    request_id: Identifier
    settlement: SettlementInstruction
    note: str | None = Field(None, max_length=500)


class ClearingStep(BaseModel):
    """One status change of an instruction and the receipt event that caused it."""

    at_ms: int
    status: str
    event_id: str


class Clearing(BaseModel):
    """Clearing status of one settlement instruction."""

    instruction_id: str | None
    history: list[ClearingStep] = Field(default_factory=list)
    avcc_record_id: int | None = None
    status: str | None = None
    tx_hash: str | None = None
    block_height: int | None = None
    error: str | None = None
    updated_ms: int | None = None
    seen: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _seen_from_history(cls, data: Any) -> Any:
        """States stored before ``seen`` existed: their history names the receipts applied."""
        if isinstance(data, dict) and "seen" not in data:
            steps = data.get("history") or []
            return {**data, "seen": {s["event_id"]: s["at_ms"] for s in steps}}
        return data

    def public(self) -> dict[str, Any]:
        """The instruction's clearing as the HTTP API shows it (without the dedup bookkeeping)."""
        return self.model_dump(mode="json", exclude={"seen"})


def is_duplicate(clearing: Clearing | None, envelope: Envelope[Any]) -> bool:
    """Whether this receipt was already applied to the instruction."""
    return clearing is not None and SEEN.contains(clearing.seen, str(envelope.event_id))


def clearing_update(previous: Clearing | None, envelope: Envelope[ChainTxConfirmed], now: int) -> Clearing:
    """The instruction's clearing after a settlement receipt (a cleared instruction stays cleared)."""
    p = envelope.payload
    event_id = str(envelope.event_id)
    record = previous or Clearing(instruction_id=p.instruction_id)
    seen = SEEN.remember(record.seen, event_id, now)
    if record.status == "cleared":
        return record.model_copy(update={"seen": seen})
    status = "cleared" if p.status == "success" else "failed"
    return record.model_copy(
        update={
            "avcc_record_id": p.avcc_record_id,
            "status": status,
            "tx_hash": p.tx_hash,
            "block_height": p.block_height,
            "error": p.error,
            "updated_ms": now,
            "history": [*record.history, ClearingStep(at_ms=now, status=status, event_id=event_id)],
            "seen": seen,
        }
    )


def instruction_pending(request: InstructionRequest) -> Outgoing:
    """The settlement transaction of an instruction (same instruction -> same event id)."""
    instruction_id = request.settlement.instruction_id
    payload = ChainTxPending(
        avcc_record_id=request.avcc_record_id,
        chain_type="settlement",
        idempotency_key=f"settlement-{instruction_id}",
        request_id=request.request_id,
        settlement=request.settlement,
    )
    envelope = make_envelope(
        payload, source="settlement-svc", event_id=uuid.uuid5(EVENT_NS, f"instruction:{instruction_id}")
    )
    return Outgoing(CHAIN_TX_PENDING, envelope, request.avcc_record_id)
