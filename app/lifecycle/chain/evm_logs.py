"""Reading the registry's event logs of one block from an EVM node, robust to a node whose log
filter misses a block.

ganache answers a filtered ``eth_getLogs`` (address, topics) from each block's bloom filter, and a
block mined right after ``miner_start`` can carry a bloom without its log: the receipt holds the
log, the filtered query returns nothing (seen in this project's tests, on several days). Where a
log must exist -- the contract says which block registered a record -- a filtered answer that is
empty is checked against the block's logs read unfiltered and matched here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from web3 import AsyncWeb3

__all__ = ["block_logs", "log_matches"]


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
    else -- when that finds none -- the block's every log, matched here."""
    query: Any = {"address": address, "fromBlock": block, "toBlock": block, "topics": list(topics)}
    filtered = list(await w3.eth.get_logs(query))
    if filtered:
        return filtered
    every = await w3.eth.get_logs({"fromBlock": block, "toBlock": block})
    return [log for log in every if log_matches(log, address, topics)]
