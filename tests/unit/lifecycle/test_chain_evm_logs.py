"""log_matches: a log read unfiltered is matched on the emitting contract and its first topics,
whatever form (checksum or lower-case address, bytes or hex topics) the node answered in.
block_logs: a node whose log queries miss a block is read through that block's receipts."""

from __future__ import annotations

from typing import Any

from hexbytes import HexBytes

from app.lifecycle.chain.evm_logs import block_logs, log_matches
from app.lifecycle.chain.registry import WORK_EVENT, event_topic

CONTRACT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
WORK = event_topic(WORK_EVENT)
RECORD_7 = "0x" + (7).to_bytes(32, "big").hex()


def _log(address: str, *topics: str) -> dict[str, object]:
    return {"address": address, "topics": [HexBytes(t) for t in topics]}


def test_the_registration_of_the_record_matches() -> None:
    assert log_matches(_log(CONTRACT, WORK, RECORD_7), CONTRACT, [WORK, RECORD_7])
    assert log_matches(_log(CONTRACT.lower(), WORK, RECORD_7), CONTRACT, [WORK])
    assert log_matches({"address": CONTRACT, "topics": [WORK.upper().replace("0X", "0x")]}, CONTRACT, [WORK])


def test_another_contract_record_or_event_does_not() -> None:
    other = "0x" + "11" * 20
    record_8 = "0x" + (8).to_bytes(32, "big").hex()
    assert not log_matches(_log(other, WORK, RECORD_7), CONTRACT, [WORK, RECORD_7])
    assert not log_matches(_log(CONTRACT, WORK, record_8), CONTRACT, [WORK, RECORD_7])
    assert not log_matches(_log(CONTRACT, record_8, RECORD_7), CONTRACT, [WORK, RECORD_7])
    assert not log_matches(_log(CONTRACT, WORK), CONTRACT, [WORK, RECORD_7])


class _Node:
    """The ``eth`` of a node holding one block: its log queries answer ``filtered`` and
    ``unfiltered``, its receipts hold each transaction's logs; every call is recorded."""

    def __init__(self, filtered: list[Any], unfiltered: list[Any], txs: list[dict[str, Any]]) -> None:
        self.filtered, self.unfiltered, self.txs = filtered, unfiltered, txs
        self.calls: list[str] = []
        self.eth = self

    async def get_logs(self, query: dict[str, Any]) -> list[Any]:
        self.calls.append("get_logs filtered" if "address" in query else "get_logs")
        return self.filtered if "address" in query else self.unfiltered

    async def get_block(self, block: int, full_transactions: bool) -> dict[str, Any]:
        self.calls.append("get_block")
        assert full_transactions
        return {"number": block, "transactions": [{"hash": t["hash"], "to": t["to"]} for t in self.txs]}

    async def get_transaction_receipt(self, tx_hash: str) -> dict[str, Any]:
        self.calls.append(f"receipt {tx_hash}")
        return {"logs": next(t["logs"] for t in self.txs if t["hash"] == tx_hash)}


async def test_a_block_whose_log_queries_miss_is_read_through_its_receipts_to_the_contract() -> None:
    registration = _log(CONTRACT, WORK, RECORD_7)
    other = "0x" + "11" * 20
    node = _Node(
        [],
        [],
        [
            {"hash": "0xa", "to": other, "logs": [_log(other, WORK, RECORD_7)]},
            {"hash": "0xb", "to": CONTRACT.lower(), "logs": [registration]},
            {"hash": "0xc", "to": None, "logs": []},  # a contract creation
        ],
    )
    w3: Any = node
    assert await block_logs(w3, 2, CONTRACT, [WORK, RECORD_7]) == [registration]
    assert node.calls == ["get_logs filtered", "get_logs", "get_block", "receipt 0xb"]


async def test_receipts_are_not_read_when_a_log_query_finds_the_log() -> None:
    registration = _log(CONTRACT, WORK, RECORD_7)
    node = _Node([], [_log(CONTRACT, WORK), registration], [])
    w3: Any = node
    assert await block_logs(w3, 2, CONTRACT, [WORK, RECORD_7]) == [registration]
    assert node.calls == ["get_logs filtered", "get_logs"]
    node = _Node([registration], [], [])
    w3 = node
    assert await block_logs(w3, 2, CONTRACT, [WORK, RECORD_7]) == [registration]
    assert node.calls == ["get_logs filtered"]


async def test_a_block_without_the_registration_gives_no_log() -> None:
    node = _Node([], [], [{"hash": "0xb", "to": CONTRACT, "logs": [_log(CONTRACT, WORK)]}])
    w3: Any = node
    assert await block_logs(w3, 2, CONTRACT, [WORK, RECORD_7]) == []
