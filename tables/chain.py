"""State of the chain group: processed review results, chain submissions, parked events.

Backed by faust tables of App ``avcc-chain`` in RocksDB (``<datadir>/workers/chain``), each
replicated to its compacted changelog topic ``avcc-chain-<table>-changelog``:

* ``reviews-seen`` - avcc_record_id -> :class:`ReviewsSeen` (review results already turned into
  pending transactions; 12 partitions, co-partitioned with review.task.finished);
* ``submissions`` - idempotency key -> :class:`Submission` (6 partitions, co-partitioned with
  chain.tx.pending);
* ``chain-reviews-parked`` / ``chain-pending-parked`` - message ids waiting in the retry path.

The chain backend keeps its own store: the local ledger in ``<datadir>/ledger`` (see
:mod:`app.lifecycle.chain.ledger`), or the EVM backend's journal of sent transactions in
``<datadir>/chain-journal`` (see :mod:`app.lifecycle.chain.journal`).
"""

from __future__ import annotations

from typing import Any

from app.lifecycle.chain.transactions import ReviewsSeen, Submission
from app.platform.faust.app import get_app
from app.platform.faust.tables import ModelTable, model_table, parking_table
from app.platform.topics import CHAIN_TX_PENDING, REVIEW_TASK_FINISHED

__all__ = ["pending_parking", "review_parking", "reviews_seen", "submissions"]

_app = get_app("chain")

reviews_seen: ModelTable[ReviewsSeen] = model_table(
    _app,
    "reviews-seen",
    ReviewsSeen,
    partitions=REVIEW_TASK_FINISHED.partitions,
    help="Dedup set of review results (chain group)",
)
submissions: ModelTable[Submission] = model_table(
    _app,
    "submissions",
    Submission,
    partitions=CHAIN_TX_PENDING.partitions,
    help="Chain submissions and their receipts (chain group)",
)
review_parking: Any = parking_table(_app, "chain-reviews", REVIEW_TASK_FINISHED.partitions)
pending_parking: Any = parking_table(_app, "chain-pending", CHAIN_TX_PENDING.partitions)
