"""Tables of the chain group: processed review results and chain submissions."""

from __future__ import annotations

from typing import Any

from app.platform.faust.app import get_app
from app.platform.topics import CHAIN_TX_PENDING, REVIEW_TASK_FINISHED

__all__ = ["reviews_seen", "submissions"]

_app = get_app("chain")

#: avcc_record_id -> {event_id: seen_ms} of review results turned into pending transactions
#: (12 partitions, co-partitioned with review.task.finished).
reviews_seen: Any = _app.Table(
    "reviews-seen",
    partitions=REVIEW_TASK_FINISHED.partitions,
    key_type=bytes,
    value_type=bytes,
    help="Dedup set of review results (chain group)",
)

#: idempotency_key -> receipt JSON (6 partitions, co-partitioned with chain.tx.pending).
submissions: Any = _app.Table(
    "submissions",
    partitions=CHAIN_TX_PENDING.partitions,
    key_type=bytes,
    value_type=bytes,
    help="Chain submissions and their receipts (chain group)",
)
