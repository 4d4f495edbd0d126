"""Notarisation steps of the chain group: approved reviews -> pending, receipts -> confirmed."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from app.lifecycle.chain.ledger import Receipt, crd_address
from app.lifecycle.chain.transactions import (
    EVENT_NS,
    PENDING_SEEN,
    REVIEWS_SEEN,
    ReviewsSeen,
    Submission,
    evidence_pending,
    pending_tx,
    receipt_confirmed,
    submission_of,
)
from app.platform.errors import BusinessRuleViolation
from app.platform.topics import CHAIN_TX_CONFIRMED, CHAIN_TX_PENDING, DAY_MS
from schemas.chain import ChainTxConfirmed, ChainTxPending
from schemas.envelope import Envelope, make_envelope
from schemas.review import ReviewTaskFinished

HASH = "sha256:" + hashlib.sha256(b"work").hexdigest()
REPORT = "sha256:" + hashlib.sha256(b"report").hexdigest()


def finished(decision: str = "approved", content_hash: str | None = HASH) -> Envelope[ReviewTaskFinished]:
    payload = ReviewTaskFinished(
        request_id="req_1",
        avcc_record_id=10042,
        review_report_id=10042,
        decision=decision,  # type: ignore[arg-type]
        final_level="O",
        overall_score=91.0,
        report_hash=REPORT,
        content_hash=content_hash,
        applicant_id="alice",
    )
    return make_envelope(payload, source="review-svc")


def receipt(tx: ChainTxPending, status: str = "success") -> Receipt:
    return Receipt(
        tx.idempotency_key,
        tx.chain_type,
        tx.avcc_record_id,
        "0x" + "ab" * 32,
        7,
        status,  # type: ignore[arg-type]
        crd_address(tx.chain_type),
        "reverted" if status == "failed" else None,
    )


def test_approved_review_becomes_an_evidence_transaction() -> None:
    review = finished()
    out = evidence_pending(review)
    assert out is not None and out.topic == CHAIN_TX_PENDING and out.avcc_record_id == 10042
    tx = out.envelope.payload
    assert isinstance(tx, ChainTxPending)
    assert (tx.chain_type, tx.idempotency_key) == ("copyright_main", "evidence-10042")
    assert tx.evidence is not None and tx.evidence.content_hash == HASH
    assert out.envelope.event_id == uuid.uuid5(EVENT_NS, f"pending:{review.event_id}")


def test_other_decisions_make_no_transaction_and_approval_needs_the_hash() -> None:
    assert evidence_pending(finished("rejected")) is None
    with pytest.raises(BusinessRuleViolation):
        evidence_pending(finished(content_hash=None))


def test_receipt_becomes_confirmed_with_a_stable_event_id() -> None:
    out = evidence_pending(finished())
    assert out is not None
    tx = out.envelope.payload
    assert isinstance(tx, ChainTxPending)
    first = receipt_confirmed(tx, receipt(tx), tx.idempotency_key)
    again = receipt_confirmed(tx, receipt(tx), tx.idempotency_key)
    assert first.topic == CHAIN_TX_CONFIRMED and first.envelope.event_id == again.envelope.event_id
    confirmed = first.envelope.payload
    assert isinstance(confirmed, ChainTxConfirmed)
    assert (confirmed.status, confirmed.block_height, confirmed.instruction_id) == ("success", 7, None)
    assert pending_tx(tx).body == tx.model_dump(mode="json", exclude_none=True)


def test_submission_remembers_the_events_that_asked_within_retention() -> None:
    out = evidence_pending(finished())
    assert out is not None
    tx = out.envelope.payload
    assert isinstance(tx, ChainTxPending)
    first = submission_of(None, tx, receipt(tx), "e1", 0)
    later = submission_of(first, tx, receipt(tx), "e2", 8 * DAY_MS)
    assert first.seen == {"e1": 0}
    assert later.seen == {"e2": 8 * DAY_MS}  # chain.tx.pending keeps events 7 days
    assert Submission.model_validate_json(later.model_dump_json()) == later
    assert PENDING_SEEN.retention_ms == 7 * DAY_MS and REVIEWS_SEEN.retention_ms == 7 * DAY_MS


def test_reviews_seen_is_stored_as_a_plain_mapping() -> None:
    assert ReviewsSeen().model_dump_json() == "{}"
    assert ReviewsSeen.model_validate_json(b'{"e":1}').root == {"e": 1}
