"""Notarisation on chain: approved reviews become pending transactions, receipts become confirmations.

Pure steps of the chain group. :func:`evidence_pending` turns an approved review into the
evidence transaction of ``chain.tx.pending``; :func:`receipt_confirmed` turns a ledger receipt
into ``chain.tx.confirmed``. Both use name-based event ids, so a replay produces the same events.
:class:`Submission` is what the group remembers of a submitted transaction.
"""

from __future__ import annotations

import uuid
from typing import Final

from pydantic import BaseModel, Field, RootModel

from app.lifecycle.chain.ledger import PendingTx, Receipt
from app.platform.errors import BusinessRuleViolation
from app.platform.faust.dedup import SeenEvents
from app.platform.faust.effects import Outgoing
from app.platform.topics import CHAIN_TX_CONFIRMED, CHAIN_TX_PENDING, REVIEW_TASK_FINISHED
from schemas.chain import ChainTxConfirmed, ChainTxPending, EvidencePayload
from schemas.envelope import Envelope, make_envelope
from schemas.review import ReviewTaskFinished

__all__ = [
    "EVENT_NS",
    "PENDING_SEEN",
    "REVIEWS_SEEN",
    "ReviewsSeen",
    "Submission",
    "evidence_pending",
    "pending_tx",
    "receipt_confirmed",
    "submission_of",
]

EVENT_NS: Final = uuid.UUID("9d2c0b55-7c7a-4a5e-b0a8-2f4c3f1e7d21")
#: Review results already turned into pending transactions, per record.
REVIEWS_SEEN = SeenEvents.for_inputs(REVIEW_TASK_FINISHED)
#: Pending-transaction events already submitted, per idempotency key.
PENDING_SEEN = SeenEvents.for_inputs(CHAIN_TX_PENDING)


class ReviewsSeen(RootModel[dict[str, int]]):
    """Event ids of a record's review results already processed (``event_id -> ms``)."""

    root: dict[str, int] = Field(default_factory=dict)


class Submission(BaseModel):
    """A transaction submitted to the chain backend, its receipt, and the events that asked."""

    avcc_record_id: int
    chain_type: str
    tx_hash: str
    block_height: int
    status: str
    seen: dict[str, int] = Field(default_factory=dict)


def evidence_pending(envelope: Envelope[ReviewTaskFinished]) -> Outgoing | None:
    """The evidence-notarisation transaction of an approved review; ``None`` for other decisions."""
    r = envelope.payload
    if r.decision != "approved":
        return None
    if r.content_hash is None:
        raise BusinessRuleViolation("payload.content_hash: needed to notarise an approved work")
    payload = ChainTxPending(
        avcc_record_id=r.avcc_record_id,
        chain_type="copyright_main",
        idempotency_key=f"evidence-{r.avcc_record_id}",
        request_id=r.request_id,
        evidence=EvidencePayload(
            content_hash=r.content_hash,
            report_hash=r.report_hash,
            final_level=r.final_level,
            review_report_id=r.review_report_id,
            applicant_id=r.applicant_id,
        ),
    )
    env = make_envelope(
        payload, source="chain-svc", event_id=uuid.uuid5(EVENT_NS, f"pending:{envelope.event_id}")
    )
    return Outgoing(CHAIN_TX_PENDING, env, r.avcc_record_id)


def pending_tx(tx: ChainTxPending) -> PendingTx:
    """The ledger transaction of a pending-transaction event (its whole payload is the body)."""
    return PendingTx(
        idempotency_key=tx.idempotency_key,
        chain_type=tx.chain_type,
        avcc_record_id=tx.avcc_record_id,
        body=tx.model_dump(mode="json", exclude_none=True),
    )


def receipt_confirmed(tx: ChainTxPending, receipt: Receipt, idempotency_key: str) -> Outgoing:
    """``chain.tx.confirmed`` for a receipt (same key -> same event id)."""
    payload = ChainTxConfirmed(
        avcc_record_id=tx.avcc_record_id,
        chain_type=tx.chain_type,
        tx_hash=receipt.tx_hash,
        block_height=receipt.block_height,
        status=receipt.status,
        crd_address=receipt.crd_address,
        idempotency_key=idempotency_key,
        instruction_id=tx.settlement.instruction_id if tx.settlement is not None else None,
        error=receipt.error,
    )
    env = make_envelope(
        payload, source="chain-svc", event_id=uuid.uuid5(EVENT_NS, f"confirmed:{idempotency_key}")
    )
    return Outgoing(CHAIN_TX_CONFIRMED, env, tx.avcc_record_id)


def submission_of(
    previous: Submission | None, tx: ChainTxPending, receipt: Receipt, event_id: str, now: int
) -> Submission:
    """What to remember once ``tx`` (event ``event_id``) got ``receipt``."""
    return Submission(
        avcc_record_id=tx.avcc_record_id,
        chain_type=tx.chain_type,
        tx_hash=receipt.tx_hash,
        block_height=receipt.block_height,
        status=receipt.status,
        seen=PENDING_SEEN.remember(previous.seen if previous else {}, event_id, now),
    )
