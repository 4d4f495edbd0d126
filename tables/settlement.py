"""State of the settlement group: clearing status per settlement instruction, parked receipts.

Backed by faust tables of App ``avcc-settlement`` in RocksDB (``<datadir>/workers/settlement``),
each replicated to its compacted changelog topic ``avcc-settlement-<table>-changelog``:

* ``clearing`` - instruction_id -> :class:`Clearing`, written while processing
  chain.tx.confirmed (6 partitions);
* ``settlement-confirmed-parked`` - message ids of receipts waiting in the retry path.
"""

from __future__ import annotations

from typing import Any

from app.lifecycle.settlement.clearing import Clearing
from app.platform.faust.app import get_app
from app.platform.faust.tables import ModelTable, model_table, parking_table
from app.platform.topics import CHAIN_TX_CONFIRMED

__all__ = ["clearing", "parking"]

_app = get_app("settlement")

clearing: ModelTable[Clearing] = model_table(
    _app,
    "clearing",
    Clearing,
    partitions=CHAIN_TX_CONFIRMED.partitions,
    help="Clearing status per settlement instruction (settlement group)",
)
parking: Any = parking_table(_app, "settlement-confirmed", CHAIN_TX_CONFIRMED.partitions)
