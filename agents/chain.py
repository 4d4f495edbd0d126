"""chain group (chain-svc): wiring of approved reviews -> ``chain.tx.pending`` -> chain -> confirmations.

Submission is idempotent by the transaction's idempotency key twice over: the ``submissions``
table remembers receipts, and the chain backend itself returns the original receipt for a key
it has seen (so a crash between submitting and recording never makes a second transaction).
The logic lives in :mod:`app.lifecycle.chain`; the state in :mod:`tables.chain`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.lifecycle.chain.backends import open_backend
from app.lifecycle.chain.ledger import ChainBackend
from app.lifecycle.chain.transactions import (
    PENDING_SEEN,
    REVIEWS_SEEN,
    ReviewsSeen,
    evidence_pending,
    pending_tx,
    receipt_confirmed,
    submission_of,
)
from app.platform.faust.app import get_app
from app.platform.faust.runtime import Effects, GroupRuntime, now_ms, source_topic
from app.platform.http.views import install_common_views
from app.platform.settings import get_settings
from app.platform.topics import CHAIN_TX_PENDING, REVIEW_TASK_FINISHED
from schemas.chain import ChainTxPending
from schemas.envelope import Envelope
from tables.chain import pending_parking, review_parking, reviews_seen, submissions

__all__ = ["app"]

app = get_app("chain")
settings = get_settings()
runtime = GroupRuntime("chain", "chain-svc", app)
install_common_views(app, "chain")

review_results = source_topic(app, REVIEW_TASK_FINISHED)
pending = source_topic(app, CHAIN_TX_PENDING)

_backend: ChainBackend | None = None
_backend_lock = asyncio.Lock()


async def backend() -> ChainBackend:
    """The backend ``AVCC_CHAIN_URL`` selects: the local ledger (default) or an EVM node.

    Both are single writers (the ledger's RocksDB lock; the EVM signing key's nonces and the
    journal): run one chain worker per ledger or key.
    """
    global _backend
    async with _backend_lock:
        if _backend is None:
            _backend = open_backend(settings)
        return _backend


async def handle_review_result(envelope: Envelope[Any]) -> Effects:
    """Approved review -> pending evidence transaction (deduplicated per record)."""
    key = str(envelope.payload.avcc_record_id)
    seen = reviews_seen.get(key) or ReviewsSeen()
    event_id = str(envelope.event_id)
    if REVIEWS_SEEN.contains(seen.root, event_id):
        return Effects(duplicate=True)
    output = evidence_pending(envelope)
    remembered = ReviewsSeen(REVIEWS_SEEN.remember(seen.root, event_id, now_ms()))
    return Effects(outputs=[output] if output else [], writes=[reviews_seen.write(key, remembered)])


async def handle_pending(envelope: Envelope[Any]) -> Effects:
    """Submit a pending transaction (idempotent by key) and publish its receipt."""
    tx: ChainTxPending = envelope.payload
    known = submissions.get(tx.idempotency_key)
    if known is not None and PENDING_SEEN.contains(known.seen, str(envelope.event_id)):
        return Effects(duplicate=True)
    chain = await backend()
    receipt = await chain.submit(pending_tx(tx))
    output = receipt_confirmed(tx, receipt, tx.idempotency_key)
    record = submission_of(known, tx, receipt, str(envelope.event_id), now_ms())
    return Effects(outputs=[output], writes=[submissions.write(tx.idempotency_key, record)])


@app.agent(review_results)
async def notarise_approved(stream: Any) -> None:
    """review.task.finished (approved) -> chain.tx.pending."""

    await runtime.consume(stream, handle_review_result, parking=review_parking)


#: Records whose pending transactions a batch submits at once: they wait for the same block
#: instead of one block each (a block every 100 ms would otherwise cap the chain at ~10
#: transactions per second); a record's own transactions are submitted one after the other.
SUBMIT_CONCURRENCY = 1000


@app.agent(pending)
async def submit_pending(stream: Any) -> None:
    """chain.tx.pending -> chain backend -> chain.tx.confirmed (per record in order)."""

    await runtime.consume(stream, handle_pending, parking=pending_parking, concurrency=SUBMIT_CONCURRENCY)
