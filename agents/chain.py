"""chain group (chain-svc): approved reviews -> ``chain.tx.pending`` -> ledger -> ``chain.tx.confirmed``.

Submission is idempotent by the transaction's idempotency key twice over: the ``submissions``
table remembers receipts, and the chain backend itself returns the original receipt for a key
it has seen (so a crash between submitting and recording never makes a second transaction).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson

from app.lifecycle.chain.ledger import ChainBackend, LocalLedger, PendingTx
from app.platform.errors import BusinessRuleViolation
from app.platform.faust.app import get_app
from app.platform.faust.runtime import Effects, GroupRuntime, KeyedConcurrency, Outgoing, now_ms
from app.platform.http.views import install_common_views
from app.platform.kafka.partitioner import record_key
from app.platform.settings import get_settings
from app.platform.topics import CHAIN_TX_CONFIRMED, CHAIN_TX_PENDING, REVIEW_TASK_FINISHED
from schemas.chain import ChainTxConfirmed, ChainTxPending, EvidencePayload
from schemas.envelope import Envelope, make_envelope
from schemas.review import ReviewTaskFinished
from tables.chain import reviews_seen, submissions

__all__ = ["app", "evidence_pending", "receipt_confirmed"]

app = get_app("chain")
settings = get_settings()
runtime = GroupRuntime("chain", "chain-svc", app)
install_common_views(app, "chain")

EVENT_NS = uuid.UUID("9d2c0b55-7c7a-4a5e-b0a8-2f4c3f1e7d21")
SEEN_TTL_MS = 7 * 24 * 60 * 60 * 1000

review_results = app.topic(
    REVIEW_TASK_FINISHED.name,
    partitions=REVIEW_TASK_FINISHED.partitions,
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
pending = app.topic(
    CHAIN_TX_PENDING.name,
    partitions=CHAIN_TX_PENDING.partitions,
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
review_parking = runtime.parking_table("chain-reviews", REVIEW_TASK_FINISHED.partitions)
pending_parking = runtime.parking_table("chain-pending", CHAIN_TX_PENDING.partitions)

_backend: ChainBackend | None = None
_backend_lock = asyncio.Lock()


async def backend() -> ChainBackend:
    """The chain backend (the local ledger; single writer: run one chain worker with it)."""
    global _backend
    async with _backend_lock:
        if _backend is None:
            _backend = LocalLedger(settings.resolve_data_path("ledger"), settings.block_interval_ms)
        return _backend


def evidence_pending(envelope: Envelope[ReviewTaskFinished]) -> Outgoing | None:
    """The evidence-notarisation transaction of an approved review (pure); None otherwise."""
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


def receipt_confirmed(tx: ChainTxPending, receipt: Any, idempotency_key: str) -> Outgoing:
    """``chain.tx.confirmed`` for a receipt (pure; same key -> same event id)."""
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


async def handle_review_result(envelope: Envelope[Any]) -> Effects:
    """Approved review -> pending evidence transaction (deduplicated per record)."""
    key = record_key(envelope.payload.avcc_record_id)
    seen: dict[str, int] = orjson.loads(reviews_seen.get(key) or b"{}")
    event_id = str(envelope.event_id)
    if event_id in seen:
        return Effects(duplicate=True)
    output = evidence_pending(envelope)
    now = now_ms()
    seen = {k: v for k, v in seen.items() if now - v < SEEN_TTL_MS}
    seen[event_id] = now

    def store() -> None:
        reviews_seen[key] = orjson.dumps(seen)

    return Effects(outputs=[output] if output else [], apply=store)


async def handle_pending(envelope: Envelope[Any]) -> Effects:
    """Submit a pending transaction (idempotent by key) and publish its receipt."""
    tx: ChainTxPending = envelope.payload
    key = tx.idempotency_key.encode()
    known = submissions.get(key)
    if known and str(envelope.event_id) in orjson.loads(known).get("seen", {}):
        return Effects(duplicate=True)
    ledger = await backend()
    body = tx.model_dump(mode="json", exclude_none=True)
    receipt = await ledger.submit(
        PendingTx(
            idempotency_key=tx.idempotency_key,
            chain_type=tx.chain_type,
            avcc_record_id=tx.avcc_record_id,
            body=body,
        )
    )
    output = receipt_confirmed(tx, receipt, tx.idempotency_key)
    previous = orjson.loads(known) if known else {"seen": {}}
    record = {
        "avcc_record_id": tx.avcc_record_id,
        "chain_type": tx.chain_type,
        "tx_hash": receipt.tx_hash,
        "block_height": receipt.block_height,
        "status": receipt.status,
        "seen": {**previous["seen"], str(envelope.event_id): now_ms()},
    }

    def store() -> None:
        submissions[key] = orjson.dumps(record)

    return Effects(outputs=[output], apply=store)


@app.agent(review_results)
async def notarise_approved(stream: Any) -> None:
    """review.task.finished (approved) -> chain.tx.pending."""
    async for event in stream.events():
        await runtime.process(event, handle_review_result, parking=review_parking)


#: Pending transactions in flight at once: they wait for the same block instead of one block
#: each (a block every 100 ms would otherwise cap the chain at ~10 transactions per second).
SUBMIT_CONCURRENCY = 256


@app.agent(pending)
async def submit_pending(stream: Any) -> None:
    """chain.tx.pending -> chain backend -> chain.tx.confirmed (per record in order)."""

    async def submit(event: Any) -> None:
        await runtime.process(event, handle_pending, parking=pending_parking)

    await KeyedConcurrency(SUBMIT_CONCURRENCY).run(stream.noack(), submit)
