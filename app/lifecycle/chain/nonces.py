"""Nonce arithmetic of the EVM backend's one signing key (pure).

An account's transactions are mined strictly in nonce order, so one nonce that no transaction
holds stalls every transaction behind it forever. Nodes do not help: ganache answers
``eth_getTransactionCount(addr, "pending")`` with the *mined* count (its pool is invisible
there), and forgets its whole pool on a restart. So the backend trusts its write-ahead journal
(every signed transaction is journaled before it is sent) over the node's pending count:

* a new transaction takes :func:`next_nonce`: past both the node's count and every journaled one;
* :func:`gaps` are the nonces below the highest journaled one that nothing holds (a transaction
  the node refused and the journal then dropped); the nonce keeper fills each with a no-op
  transfer so the ones behind it can be mined;
* :func:`plan_repair` says, for one look at the node, what the keeper does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.lifecycle.chain.journal import SentTx

__all__ = ["NonceRepair", "gaps", "next_nonce", "plan_repair"]


def next_nonce(node_count: int, journaled: Iterable[int]) -> int:
    """The nonce of the next new transaction: past the node's count and every journaled nonce."""
    return max(node_count, max(journaled, default=-1) + 1)


def gaps(mined_count: int, journaled: Iterable[int]) -> list[int]:
    """Nonces from ``mined_count`` up to the highest journaled one that no journaled transaction holds."""
    held = {n for n in journaled if n >= mined_count}
    if not held:
        return []
    return [n for n in range(mined_count, max(held)) if n not in held]


@dataclass(frozen=True)
class NonceRepair:
    """What the nonce keeper does after one look at the node."""

    #: Nonces to fill with a no-op transaction (nothing will ever be sent with them otherwise).
    fill: list[int]
    #: Journaled transactions waiting to be mined, lowest nonce first (each rebroadcast when
    #: the node does not know it).
    waiting: list[tuple[str, SentTx]]
    #: The transaction next in line, when it is overdue (replace it with a higher gas price).
    overdue: tuple[str, SentTx] | None


def plan_repair(
    mined_count: int,
    in_flight: Mapping[str, SentTx],
    now_ms: int,
    timeout_ms: int,
) -> NonceRepair:
    """The repair for ``in_flight`` (key -> journaled transaction) when ``mined_count`` are mined.

    Only the transaction whose nonce is next in line can be late for its own sake (its gas
    price); one further back waits for those before it, so replacing it would only cost fees.
    """
    waiting = sorted(
        ((key, sent) for key, sent in in_flight.items() if sent.nonce >= mined_count),
        key=lambda item: item[1].nonce,
    )
    head = waiting[0] if waiting and waiting[0][1].nonce == mined_count else None
    overdue = head if head is not None and now_ms - head[1].sent_ms >= timeout_ms else None
    return NonceRepair(gaps(mined_count, (s.nonce for _, s in waiting)), waiting, overdue)
