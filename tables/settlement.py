"""Tables of the settlement group: clearing status per settlement instruction."""

from __future__ import annotations

from typing import Any

from app.platform.faust.app import get_app
from app.platform.topics import CHAIN_TX_CONFIRMED

__all__ = ["clearing"]

#: instruction_id -> clearing JSON, written while processing chain.tx.confirmed (6 partitions).
clearing: Any = get_app("settlement").Table(
    "clearing",
    partitions=CHAIN_TX_CONFIRMED.partitions,
    key_type=bytes,
    value_type=bytes,
    help="Clearing status per settlement instruction (settlement group)",
)
