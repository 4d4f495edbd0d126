"""Verification of the EVM backend: every notarised record re-read from the AvccRegistry contract.

``avcc chain verify`` with ``AVCC_CHAIN_URL=http(s)://...`` reads what chain-svc announced
(``chain.tx.confirmed`` evidence receipts and, for their content hashes, ``chain.tx.pending``)
and checks each record whose ``crd_address`` is the configured contract against it: registered,
by the announced transaction, in the announced block, with the announced content hash, exactly
once. Receipts naming another chain (the local ledger before a switch) are counted, not checked.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson
from confluent_kafka import Consumer, TopicPartition
from web3 import AsyncWeb3

from app.lifecycle.chain.deploy import require_contract
from app.lifecycle.chain.evm_logs import block_logs
from app.lifecycle.chain.registry import WORK_EVENT, event_topic, load_artefact
from app.platform.kafka.clients import consumer_config
from app.platform.settings import Settings
from app.platform.topics import CHAIN_TX_CONFIRMED, CHAIN_TX_PENDING

__all__ = [
    "EvmVerifyResult",
    "NotarisedRecord",
    "OnChainWork",
    "compare",
    "read_notarised",
    "read_registrations",
    "verify_evm",
    "verify_evm_cli",
]


@dataclass(frozen=True)
class NotarisedRecord:
    """What chain-svc announced for one record's evidence registration."""

    record_id: int
    tx_hashes: frozenset[str]
    block_height: int
    crd_address: str
    content_hash: str | None


@dataclass(frozen=True)
class OnChainWork:
    """A record's registration as the contract holds it (block 0 = not registered)."""

    record_id: int
    content_hash: str
    block_height: int
    tx_hashes: tuple[str, ...]


@dataclass(frozen=True)
class EvmVerifyResult:
    """Outcome of :func:`verify_evm`."""

    records: int
    registrations: int
    problems: list[str] = field(default_factory=list)
    other_chains: int = 0

    @property
    def ok(self) -> bool:
        """True when every record matches the contract."""
        return not self.problems

    def summary(self) -> str:
        """One line for humans (plus the first problems)."""
        head = f"{self.records} records, {self.registrations} registrations on chain"
        if self.other_chains:
            head += f" ({self.other_chains} records of other chains not checked)"
        if self.ok:
            return f"chain OK: {head}"
        shown = "\n  ".join(self.problems[:20])
        return f"chain MISMATCH ({len(self.problems)} problems): {head}\n  {shown}"


def compare(
    records: Mapping[int, NotarisedRecord], works: Mapping[int, OnChainWork], contract: str
) -> list[str]:
    """Every difference between the announced records and the contract's registrations."""
    problems: list[str] = []
    for rid, record in sorted(records.items()):
        work = works.get(rid)
        if work is None or work.block_height == 0:
            problems.append(f"record {rid}: not registered on chain")
            continue
        if len(work.tx_hashes) != 1:
            problems.append(f"record {rid}: {len(work.tx_hashes)} registration events")
        if len(record.tx_hashes) != 1 or set(record.tx_hashes) != set(work.tx_hashes):
            announced = sorted(record.tx_hashes)
            problems.append(f"record {rid}: announced tx {announced} != chain {work.tx_hashes}")
        if record.block_height != work.block_height:
            problems.append(f"record {rid}: announced block {record.block_height} != {work.block_height}")
        if record.crd_address.lower() != contract.lower():
            problems.append(f"record {rid}: crd_address {record.crd_address} is not the contract {contract}")
        if record.content_hash is not None and record.content_hash != work.content_hash:
            problems.append(f"record {rid}: content hash {record.content_hash} != chain {work.content_hash}")
    return problems


def _read_topic(settings: Settings, topic: str, idle_s: float = 3.0) -> list[bytes]:
    """Every value now in ``topic``: read to the high watermarks (or until ``idle_s`` without data)."""
    conf = consumer_config(settings, f"avcc-chain-verify-{uuid.uuid4().hex}", "avcc-chain-verify")
    consumer = Consumer(conf)
    values: list[bytes] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        reached: dict[int, int] = {p: 0 for p in partitions}
        last = time.monotonic()
        while time.monotonic() - last < idle_s and any(reached[p] < ends[p] for p in partitions):
            for message in consumer.consume(num_messages=10_000, timeout=0.3):
                if message.error() is None:
                    values.append(bytes(message.value() or b""))
                    reached[message.partition()] = message.offset() + 1
                    last = time.monotonic()
    finally:
        consumer.close()
    return values


def read_notarised(settings: Settings) -> dict[int, NotarisedRecord]:
    """Evidence receipts announced on ``chain.tx.confirmed``, with content hashes from pending."""
    contents: dict[int, str] = {}
    for raw in _read_topic(settings, CHAIN_TX_PENDING.name):
        payload = orjson.loads(raw).get("payload", {})
        if payload.get("chain_type") == "copyright_main" and payload.get("evidence"):
            contents[int(payload["avcc_record_id"])] = payload["evidence"]["content_hash"]
    records: dict[int, NotarisedRecord] = {}
    for raw in _read_topic(settings, CHAIN_TX_CONFIRMED.name):
        payload = orjson.loads(raw).get("payload", {})
        if payload.get("chain_type") != "copyright_main" or payload.get("status") != "success":
            continue
        rid = int(payload["avcc_record_id"])
        seen = records.get(rid)
        hashes = {payload["tx_hash"], *(seen.tx_hashes if seen else ())}
        records[rid] = NotarisedRecord(
            rid, frozenset(hashes), int(payload["block_height"]), payload["crd_address"], contents.get(rid)
        )
    return records


async def read_registrations(
    url: str, contract: str, record_ids: list[int]
) -> tuple[dict[int, OnChainWork], int]:
    """The contract's registration of each record, and the number of registration events on chain."""
    w3 = AsyncWeb3(AsyncWeb3.AsyncHTTPProvider(url))
    try:
        address = AsyncWeb3.to_checksum_address(contract)
        registry = w3.eth.contract(address=address, abi=load_artefact().abi)
        logs = await w3.eth.get_logs(
            {"address": address, "fromBlock": 0, "toBlock": "latest", "topics": [event_topic(WORK_EVENT)]}
        )
        by_record: dict[int, list[str]] = {}
        for log in logs:
            rid = int.from_bytes(log["topics"][1], "big")
            by_record.setdefault(rid, []).append(log["transactionHash"].to_0x_hex())
        works: dict[int, OnChainWork] = {}
        missed = 0  # logs the node's filter left out (see evm_logs), found in their block
        for rid in record_ids:
            content, _, _, block = await registry.functions.registration(rid).call()
            hashes = tuple(by_record.get(rid, ()))
            if not hashes and int(block):
                topics = [event_topic(WORK_EVENT), "0x" + rid.to_bytes(32, "big").hex()]
                found = await block_logs(w3, int(block), address, topics)
                hashes = tuple(log["transactionHash"].to_0x_hex() for log in found)
                missed += len(found)
            works[rid] = OnChainWork(rid, "sha256:" + bytes(content).hex(), int(block), hashes)
        return works, len(logs) + missed
    finally:
        await w3.provider.disconnect()


def verify_evm(settings: Settings) -> EvmVerifyResult:
    """Re-read every announced record's registration from the contract and compare."""
    contract = require_contract(settings)
    announced = read_notarised(settings)
    # receipts of another backend (the local ledger before a switch, another contract) are
    # not this contract's to check
    records = {rid: r for rid, r in announced.items() if r.crd_address.lower() == contract.lower()}
    works, events = asyncio.run(read_registrations(settings.chain_url, contract, sorted(records)))
    problems = compare(records, works, contract)
    return EvmVerifyResult(len(records), events, problems, len(announced) - len(records))


def verify_evm_cli(settings: Settings) -> int:
    """Print the verification summary; 0 if every record matches the contract, else 1."""
    result = verify_evm(settings)
    print(result.summary())
    return 0 if result.ok else 1
