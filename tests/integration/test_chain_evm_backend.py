"""EvmBackend against a real ganache node: crash recovery from the journal, replacement, nonces.

A node of this module runs with ``--miner.instamine strict`` so ``miner_stop`` can hold
transactions pending, as a congested chain would.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from web3 import AsyncHTTPProvider, AsyncWeb3, Web3

from app.lifecycle.chain.blocks import PendingTx
from app.lifecycle.chain.deploy import deploy_registry
from app.lifecycle.chain.evm import EvmBackend
from app.lifecycle.chain.evm_logs import block_logs, receipt_logs
from app.lifecycle.chain.journal import SentTx, TxJournal
from app.lifecycle.chain.keys import create_key_file
from app.lifecycle.chain.registry import (
    SETTLEMENT_EVENT,
    WORK_EVENT,
    event_topic,
    load_artefact,
    registry_call,
)
from app.platform.errors import DependencyUnavailable
from app.servers.ganache import GanacheNode, rpc_call
from app.servers.process import ServerNotInstalled
from testing.ports import free_port


@dataclass(frozen=True)
class Chain:
    """A strict-instamine ganache node, its funded key and a deployed registry."""

    node: GanacheNode
    key: str
    address: str

    def registrations(self, record_id: int) -> list[str]:
        """Hashes of the transactions that registered ``record_id``.

        Every log is read and filtered here: ganache's own address/topic filter skips a block
        whose bloom filter does not list the log, which is what a block mined right after
        ``miner_start`` had (its receipt held the log, the filtered ``eth_getLogs`` nothing).
        """
        logs: Any = rpc_call(self.node.url, "eth_getLogs", [{"fromBlock": "0x0", "toBlock": "latest"}])
        wanted = [event_topic(WORK_EVENT), "0x" + record_id.to_bytes(32, "big").hex()]
        return [
            log["transactionHash"]
            for log in logs
            if log["address"].lower() == self.address.lower() and log["topics"][:2] == wanted
        ]


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    root = tmp_path_factory.mktemp("strict-chain")
    key = create_key_file(root / "signer.key")
    node = GanacheNode(
        root / "node", port=free_port(), funded_keys=[key], instamine="strict", die_with_parent=True
    )
    try:
        node.start()
    except ServerNotInstalled as exc:
        pytest.fail(f"ganache cannot start: {exc}", pytrace=False)
    try:
        yield Chain(node, key, deploy_registry(node.url, key))
    finally:
        node.stop()


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """Where a test's backend journals (a second backend on it = the restarted worker)."""
    return tmp_path / "journal"


def _work(record_id: int) -> PendingTx:
    body = {
        "evidence": {
            "content_hash": "sha256:" + os.urandom(32).hex(),
            "report_hash": "sha256:" + os.urandom(32).hex(),
            "final_level": "O",
        }
    }
    return PendingTx(f"evidence-{record_id}", "copyright_main", record_id, body)


def _record_id() -> int:
    return 1 + int.from_bytes(os.urandom(6), "big")


def _backend(chain: Chain, journal: Path, **options: Any) -> EvmBackend:
    return EvmBackend(chain.node.url, chain.address, chain.key, TxJournal(journal), poll_s=0.05, **options)


def _sign(chain: Chain, tx: PendingTx, nonce: int) -> SentTx:
    """What a worker that died after journaling and before sending leaves behind."""
    w3 = Web3(Web3.HTTPProvider(chain.node.url))
    call = registry_call(tx)
    contract = w3.eth.contract(address=Web3.to_checksum_address(chain.address), abi=load_artefact().abi)
    account = Account.from_key(chain.key)
    fields = getattr(contract.functions, call.function)(*call.args).build_transaction(
        {"from": account.address, "nonce": nonce, "gas": 300_000, "gasPrice": w3.eth.gas_price}
    )
    signed = account.sign_transaction(fields)
    raw, tx_hash = signed.raw_transaction.to_0x_hex(), signed.hash.to_0x_hex()
    now_ms, to, data = time.time_ns() // 1_000_000, str(fields["to"]), str(fields["data"])
    return SentTx(nonce, int(fields["gasPrice"]), 300_000, raw, [tx_hash], now_ms, to, data)


def _transfer_to_self(chain: Chain, nonce: int) -> str:
    """Another transaction of the signing key (sent outside the backend) taking ``nonce``."""
    w3 = Web3(Web3.HTTPProvider(chain.node.url))
    account = Account.from_key(chain.key)
    fields = {
        "to": account.address,
        "value": 0,
        "gas": 21_000,
        "gasPrice": w3.eth.gas_price,
        "nonce": nonce,
        "chainId": w3.eth.chain_id,
    }
    return w3.eth.send_raw_transaction(account.sign_transaction(fields).raw_transaction).to_0x_hex()


def _mined_nonce(chain: Chain) -> int:
    address = Account.from_key(chain.key).address
    return int(str(rpc_call(chain.node.url, "eth_getTransactionCount", [address, "latest"])), 16)


async def _until(condition: Any, what: str, timeout_s: float = 60.0) -> Any:
    """Poll ``condition`` (the event loop running meanwhile) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g}s"
        await asyncio.sleep(0.05)
    return value


def _receipt_block(chain: Chain, tx_hash: str) -> int:
    receipt: Any = rpc_call(chain.node.url, "eth_getTransactionReceipt", [tx_hash])
    return int(receipt["blockNumber"], 16)


def _pending_nonce(chain: Chain) -> int:
    address = Account.from_key(chain.key).address
    return int(str(rpc_call(chain.node.url, "eth_getTransactionCount", [address, "pending"])), 16)


async def test_a_journaled_transaction_the_node_never_got_is_sent_on_restart(
    chain: Chain, journal: Path
) -> None:
    tx = _work(_record_id())
    sent = _sign(chain, tx, _pending_nonce(chain))
    store = TxJournal(journal)
    store.record_sent(tx.idempotency_key, sent)
    store.close()

    backend = _backend(chain, journal)
    try:
        receipt = await backend.submit(tx)
    finally:
        await backend.aclose()
    assert receipt.tx_hash == sent.hashes[0], "the journaled transaction itself must be the one mined"
    assert chain.registrations(tx.avcc_record_id) == [receipt.tx_hash]


async def test_a_transaction_not_mined_in_time_is_replaced_and_registered_once(
    chain: Chain, journal: Path
) -> None:
    tx = _work(_record_id())
    backend = _backend(chain, journal, tx_timeout_s=0.5)
    rpc_call(chain.node.url, "miner_stop")
    try:
        submitting = asyncio.create_task(backend.submit(tx))

        def replaced() -> SentTx | None:
            assert not submitting.done(), "completed with the miner stopped"
            versions = backend.in_flight(tx.idempotency_key)
            return versions if versions is not None and len(versions.hashes) >= 2 else None

        versions = await _until(replaced, "a replacement sent")
        assert not submitting.done()
        rpc_call(chain.node.url, "miner_start")
        receipt = await asyncio.wait_for(submitting, 30)
        # the block mined right after miner_start is the one ganache's log filter can miss: the
        # backend's own lookup of a registration (used when a replacement reverts as already
        # registered) still finds its transaction
        assert await backend.registered(registry_call(tx)) == (receipt.tx_hash, receipt.block_height)
    finally:
        rpc_call(chain.node.url, "miner_start")
        await backend.aclose()
    assert receipt.tx_hash in versions.hashes
    assert chain.registrations(tx.avcc_record_id) == [receipt.tx_hash]


async def test_a_registration_reads_alike_from_its_blocks_logs_and_from_its_receipts(
    chain: Chain, journal: Path
) -> None:
    # the receipts are where block_logs turns when the node's log queries miss a block (CI28,
    # under a CPU hog): on a real node they give the same log as the log query
    tx = _work(_record_id())
    backend = _backend(chain, journal)
    try:
        receipt = await backend.submit(tx)
    finally:
        await backend.aclose()
    topics = registry_call(tx).topics
    w3 = AsyncWeb3(AsyncHTTPProvider(chain.node.url))
    try:
        from_logs = await block_logs(w3, receipt.block_height, chain.address, topics)
        from_receipts = await receipt_logs(w3, receipt.block_height, chain.address, topics)
    finally:
        await w3.provider.disconnect()
    assert [log["transactionHash"].to_0x_hex() for log in from_receipts] == [receipt.tx_hash]
    assert [dict(log) for log in from_receipts] == [dict(log) for log in from_logs]


async def test_a_journaled_nonce_taken_by_another_transaction_is_sent_anew(
    chain: Chain, journal: Path
) -> None:
    first = _work(_record_id())
    nonce = _pending_nonce(chain)
    stale = _sign(chain, first, nonce)
    store = TxJournal(journal)
    store.record_sent(first.idempotency_key, stale)
    store.close()
    _transfer_to_self(chain, nonce)  # mined at once (strict instamine): the journaled nonce is gone
    backend = _backend(chain, journal)
    try:
        with pytest.raises(Exception, match="not registered yet"):
            await backend.submit(first)
        receipt = await backend.submit(first)  # the retry sends a fresh transaction
    finally:
        await backend.aclose()
    assert receipt.tx_hash != stale.hashes[0]
    assert chain.registrations(first.avcc_record_id) == [receipt.tx_hash]


async def test_a_new_transaction_never_takes_a_journaled_nonce(chain: Chain, journal: Path) -> None:
    """ganache's "pending" count is the mined count: the journal, not the node, says what is taken."""
    dead, fresh = _work(_record_id()), _work(_record_id())
    nonce = _pending_nonce(chain)
    store = TxJournal(journal)
    store.record_sent(dead.idempotency_key, _sign(chain, dead, nonce))
    store.close()
    backend = _backend(chain, journal)
    try:
        receipt = await backend.submit(fresh)
        resumed = await backend.submit(dead)
    finally:
        await backend.aclose()
    assert chain.registrations(fresh.avcc_record_id) == [receipt.tx_hash]
    assert chain.registrations(dead.avcc_record_id) == [resumed.tx_hash]
    assert _mined_nonce(chain) == nonce + 2


async def test_a_nonce_gap_is_filled_so_the_transactions_behind_it_are_mined(
    chain: Chain, journal: Path
) -> None:
    """A nonce no journaled transaction holds (one the node refused) would stall the key for ever."""
    tx = _work(_record_id())
    gap = _pending_nonce(chain)
    behind = _sign(chain, tx, gap + 1)
    store = TxJournal(journal)
    store.record_sent(tx.idempotency_key, behind)
    store.close()
    # ganache (strict instamine) can keep a transaction sent right behind the filler queued
    # until another one arrives; the backend then re-signs it once it is overdue, so the
    # overdue time stays well inside this test's wait. Either version holds the nonce behind.
    backend = _backend(chain, journal, tx_timeout_s=4.0)
    try:
        receipt = await asyncio.wait_for(backend.submit(tx), 60)
    finally:
        await backend.aclose()
    mined = rpc_call(chain.node.url, "eth_getTransactionByHash", [receipt.tx_hash])
    assert int(str(mined["nonce"]), 16) == gap + 1, "the transaction behind the gap was not the one mined"
    assert chain.registrations(tx.avcc_record_id) == [receipt.tx_hash]
    assert _mined_nonce(chain) == gap + 2, "the gap was not filled by exactly one transaction"


class _WatchedBackend(EvmBackend):
    """An :class:`EvmBackend` that records each chain head it decided to wait beyond while
    counting confirmations: the observable point where it must not have confirmed yet."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.confirming = False
        self.waited_beyond: list[int] = []

    async def _await_confirmations(self, height: int) -> None:
        self.confirming = True
        await super()._await_confirmations(height)

    async def _head_after(self, seen: int, until: float) -> int:
        if self.confirming:
            self.waited_beyond.append(seen)
        return await super()._head_after(seen, until)


async def test_confirmed_only_after_the_configured_confirmations(chain: Chain, journal: Path) -> None:
    tx = _work(_record_id())
    backend = _WatchedBackend(
        chain.node.url, chain.address, chain.key, TxJournal(journal), poll_s=0.05, confirmations=3
    )
    try:
        submitting = asyncio.create_task(backend.submit(tx))
        mined = await _until(lambda: chain.registrations(tx.avcc_record_id), "mined")
        assert mined, "not mined"
        height = _receipt_block(chain, mined[0])
        # it saw the block it was mined in and went on waiting: not confirmed with one block
        await _until(lambda: height in backend.waited_beyond, "the backend waiting beyond its block")
        assert not submitting.done(), "confirmed with a single block"
        rpc_call(chain.node.url, "evm_mine")
        await _until(lambda: height + 1 in backend.waited_beyond, "the backend waiting beyond one more")
        assert not submitting.done(), "confirmed with two blocks"
        rpc_call(chain.node.url, "evm_mine")
        receipt = await asyncio.wait_for(submitting, 10)
    finally:
        await backend.aclose()
    assert chain.registrations(tx.avcc_record_id) == [receipt.tx_hash]
    block = rpc_call(chain.node.url, "eth_getTransactionReceipt", [receipt.tx_hash])
    assert isinstance(block, dict) and int(block["blockNumber"], 16) == receipt.block_height


async def test_an_unreachable_node_is_a_retriable_dependency_failure(chain: Chain, journal: Path) -> None:
    backend = EvmBackend(f"http://127.0.0.1:{free_port()}", chain.address, chain.key, TxJournal(journal))
    try:
        with pytest.raises(DependencyUnavailable, match="unreachable"):
            await backend.submit(_work(_record_id()))
    finally:
        await backend.aclose()


async def test_a_settlement_instruction_is_recorded_once(chain: Chain, journal: Path) -> None:
    body = {"settlement": {"instruction_id": f"ins-{os.urandom(4).hex()}", "total_cny": "12.50"}}
    tx = PendingTx(f"settle-{body['settlement']['instruction_id']}", "settlement", _record_id(), body)
    backend = _backend(chain, journal)
    try:
        first = await backend.submit(tx)
        again = await backend.submit(tx)
    finally:
        await backend.aclose()
    fresh = _backend(chain, journal.with_name("other-journal"))  # no journal: found via the contract
    try:
        found = await fresh.submit(tx)
    finally:
        await fresh.aclose()
    assert first == again == found
    logs: Any = rpc_call(
        chain.node.url,
        "eth_getLogs",
        [
            {
                "address": chain.address,
                "fromBlock": "0x0",
                "toBlock": "latest",
                "topics": [event_topic(SETTLEMENT_EVENT)],
            }
        ],
    )
    assert [log["transactionHash"] for log in logs].count(first.tx_hash) == 1
    assert first.crd_address == chain.address and first.status == "success"
