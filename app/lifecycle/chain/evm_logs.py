"""Reading the registry's event logs of one block from an EVM node, robust to a node whose log
filter misses a block.

ganache answers a filtered ``eth_getLogs`` (address, topics) from each block's bloom filter, and a
block mined right after ``miner_start`` can carry a bloom without its log: the receipt holds the
log, the filtered query returns nothing (seen in this project's tests, on several days). Under a
CPU hog it answered a block just mined with no log even unfiltered, while the transaction's
receipt held it. Where a log must exist -- the contract says which block registered a record -- an
empty filtered answer is checked against the block's logs read unfiltered, and an empty one of
those against the receipts of the block's transactions to the contract, matched here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from web3 import AsyncWeb3

__all__ = ["block_logs", "log_matches", "receipt_logs"]


def _hex(value: Any) -> str:
    text = value if isinstance(value, str) else "0x" + bytes(value).hex()
    return text.lower()


def log_matches(log: Any, address: str, topics: Sequence[str]) -> bool:
    """Whether ``log`` was emitted by ``address`` and its first topics are ``topics`` (0x-hex)."""
    if str(log["address"]).lower() != address.lower():
        return False
    found = [_hex(t) for t in log["topics"][: len(topics)]]
    return found == [t.lower() for t in topics]


async def block_logs(w3: AsyncWeb3[Any], block: int, address: str, topics: Sequence[str]) -> list[Any]:
    """The logs of ``block`` emitted by ``address`` with ``topics`` first: the node's filter,
    else -- when that finds none -- the block's every log, else its receipts' logs, matched here."""
    query: Any = {"address": address, "fromBlock": block, "toBlock": block, "topics": list(topics)}
    filtered = list(await w3.eth.get_logs(query))
    if filtered:
        return filtered
    every = await w3.eth.get_logs({"fromBlock": block, "toBlock": block})
    matched = [log for log in every if log_matches(log, address, topics)]
    return matched or await receipt_logs(w3, block, address, topics)


async def receipt_logs(w3: AsyncWeb3[Any], block: int, address: str, topics: Sequence[str]) -> list[Any]:
    """The logs emitted by ``address`` with ``topics`` first, read from the receipts of the
    transactions of ``block`` sent to ``address``."""
    mined = await w3.eth.get_block(block, full_transactions=True)
    transactions: list[Any] = list(mined["transactions"])  # full: each a dict, not a hash
    logs: list[Any] = []
    for tx in transactions:
        if str(tx.get("to") or "").lower() != address.lower():
            continue
        receipt = await w3.eth.get_transaction_receipt(tx["hash"])
        logs += [log for log in receipt["logs"] if log_matches(log, address, topics)]
    return logs
