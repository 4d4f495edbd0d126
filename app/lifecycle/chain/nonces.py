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
    #: The transaction next in line when it is overdue, then each one right behind it (no gap
    #: between their nonces) that is overdue too, lowest nonce first: replace them with a higher
    #: gas price, in that order.
    overdue: list[tuple[str, SentTx]]


def plan_repair(
    mined_count: int,
    in_flight: Mapping[str, SentTx],
    now_ms: int,
    timeout_ms: int,
) -> NonceRepair:
    """The repair for ``in_flight`` (key -> journaled transaction) when ``mined_count`` are mined.

    The transaction next in line is late for its own sake when it is overdue (its gas price, or
    a node that stranded it). The ones right behind it that are overdue too are replaced with it
    in one pass: a node that priced out or stranded the head did the same to them (ganache keeps
    every later nonce queued until each is sent again, its issue #4522), and replaced one per
    pass they would wait a keeper interval each. One not overdue yet, or behind a gap, waits.
    """
    waiting = sorted(
        ((key, sent) for key, sent in in_flight.items() if sent.nonce >= mined_count),
        key=lambda item: item[1].nonce,
    )
    overdue: list[tuple[str, SentTx]] = []
    for key, sent in waiting:
        if sent.nonce != mined_count + len(overdue) or now_ms - sent.sent_ms < timeout_ms:
            break
        overdue.append((key, sent))
    return NonceRepair(gaps(mined_count, (s.nonce for _, s in waiting)), waiting, overdue)
