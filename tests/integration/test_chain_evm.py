"""chain-svc on a real EVM chain (ganache): registrations exactly once through crashes and outages.

The workers run against Apache Kafka and a ganache node with a freshly deployed AvccRegistry; every
check reads the chain itself (receipts, contract state, registration events).
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from eth_account import Account
from web3 import Web3
from web3.exceptions import ContractCustomError

from app.lifecycle.chain.deploy import deploy_registry
from app.lifecycle.chain.registry import WORK_EVENT, event_topic, load_artefact
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import DLQ, TOPIC_PLAN
from app.servers import KafkaKRaftBroker
from app.servers.ganache import rpc_call
from testing.ports import free_port
from tests.integration.conftest import EvmChain
from tests.integration.stack import ROOT, Stack, application, record_when, wait_for
from tests.integration.test_lifecycle import _read_all

GROUPS = ("code", "review", "chain", "retry")


class Registry:
    """Direct (synchronous web3) access to one deployed AvccRegistry, as a test's witness."""

    def __init__(self, chain: EvmChain, address: str) -> None:
        self.w3 = Web3(Web3.HTTPProvider(chain.node.url))
        self.address = Web3.to_checksum_address(address)
        self.contract = self.w3.eth.contract(address=self.address, abi=load_artefact().abi)
        self.account = Account.from_key(chain.key)

    def work_count(self) -> int:
        return int(self.contract.functions.workCount().call())

    def registration_events(self) -> list[Any]:
        """Every registration event of the contract. All logs are read and filtered here:
        ganache's address/topic filter can miss a block (see app/lifecycle/chain/evm_logs.py)."""
        topic = bytes.fromhex(event_topic(WORK_EVENT)[2:])
        return [
            log
            for log in self.w3.eth.get_logs({"fromBlock": 0, "toBlock": "latest"})
            if log["address"] == self.address and log["topics"] and bytes(log["topics"][0]) == topic
        ]

    def pending_transactions(self) -> int:
        """Transactions of the signing key waiting in the node's mempool: executable ones and
        those ganache holds queued (it can strand a run of nonces there until each is sent
        again, its issue #4522), not counting the stale queued entries of mined nonces it
        keeps listing."""
        pool = self.w3.provider.make_request("txpool_content", [])  # type: ignore[arg-type]
        sender = self.account.address.lower()
        mined = self.w3.eth.get_transaction_count(self.account.address, "latest")
        parts = [pool["result"].get(part, {}).get(sender, {}) for part in ("pending", "queued")]
        nonces = {int(n) for part in parts for n in part}
        return sum(1 for n in nonces if n >= mined)

    def send(self, function: Any, gas: int | None = None) -> Any:
        """Sign and send ``function`` (a fixed ``gas`` skips the estimate, so a revert is mined)."""
        fields = function.build_transaction(
            {
                "from": self.account.address,
                "nonce": self.w3.eth.get_transaction_count(self.account.address, "pending"),
                "gas": gas or function.estimate_gas({"from": self.account.address}),
                "gasPrice": self.w3.eth.gas_price,
            }
        )
        signed = self.account.sign_transaction(fields)
        return self.w3.eth.wait_for_transaction_receipt(
            self.w3.eth.send_raw_transaction(signed.raw_transaction)
        )


@pytest.fixture(scope="module")
def registry(evm_chain: EvmChain) -> Registry:
    """A fresh AvccRegistry on the module's ganache node, for the stack's registrations only."""
    evm_chain.node.start()
    return Registry(evm_chain, deploy_registry(evm_chain.node.url, evm_chain.key))


@pytest.fixture(scope="module")
def evm_stack(
    module_kafka: KafkaKRaftBroker,
    evm_chain: EvmChain,
    registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """code, review, chain (EVM backend, 2 confirmations) and retry workers on Kafka; retries
    outlast a 20 s outage."""
    root = tmp_path_factory.mktemp("evm-stack")
    apply_plan(Settings(kafka_url=f"kafka://{module_kafka.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    env = {
        "AVCC_CHAIN_URL": evm_chain.node.url,
        "AVCC_CHAIN_CONTRACT": registry.address,
        "AVCC_CHAIN_KEY_FILE": str(evm_chain.key_file),
        "AVCC_CHAIN_CONFIRMATIONS": "2",
        "AVCC_CHAIN_TX_TIMEOUT_S": "10",
        "AVCC_RETRY_BACKOFF_S": "[1, 2, 4, 8]",
        "AVCC_WORKER_STALL_S": "45",
    }
    stack = Stack(module_kafka.bootstrap, root, env=env)
    stack.start(*GROUPS)
    stack.supervise()
    yield stack
    stack.stop_all()


def test_contract_refuses_a_second_registration_of_the_same_content_hash(evm_chain: EvmChain) -> None:
    # a registry of its own: the stack's registry holds only what the stack registered
    registry = Registry(evm_chain, deploy_registry(evm_chain.node.url, evm_chain.key))
    content, report = os.urandom(32), os.urandom(32)
    first_id, second_id = 10**12 + int.from_bytes(os.urandom(4), "big"), 10**13 + 1
    functions = registry.contract.functions
    receipt = registry.send(functions.registerWork(first_id, content, report, 3))
    assert receipt["status"] == 1
    assert tuple(functions.registration(first_id).call()) == (content, report, 3, receipt["blockNumber"])
    assert functions.recordOf(content).call() == first_id

    with pytest.raises(ContractCustomError):
        functions.registerWork(second_id, content, os.urandom(32), 1).call({"from": registry.account.address})
    mined = registry.send(functions.registerWork(second_id, content, os.urandom(32), 1), gas=200_000)
    assert mined["status"] == 0, "the contract itself must revert a second registration of a content hash"
    assert functions.registration(second_id).call()[3] == 0
    again = registry.send(functions.registerWork(first_id, os.urandom(32), report, 3), gas=200_000)
    assert again["status"] == 0, "the contract must revert a second registration of a record id"
    assert functions.recordOf(content).call() == first_id


def _registered_by_stack(registry: Registry, ids: set[int]) -> dict[int, list[Any]]:
    events: dict[int, list[Any]] = {}
    for log in registry.registration_events():
        rid = int.from_bytes(log["topics"][1], "big")
        if rid in ids:
            events.setdefault(rid, []).append(log)
    return events


async def _apply(stack: Stack, count: int) -> list[int]:
    ids: list[int] = []
    for start in range(0, count, 20):
        answers = await asyncio.gather(
            *(
                stack.call("code", "POST", "/v1/avcc/applications", application())
                for _ in range(start, min(start + 20, count))
            )
        )
        assert all(status == 202 for status, _ in answers), answers
        ids += [answer["avcc_record_id"] for _, answer in answers]
    return ids


def _assert_on_chain(registry: Registry, records: list[dict[str, Any]]) -> None:
    """Each record's tx has a successful receipt in its block and registered exactly that record."""
    events = _registered_by_stack(registry, {r["avcc_record_id"] for r in records})
    for record in records:
        rid = record["avcc_record_id"]
        receipt = registry.w3.eth.get_transaction_receipt(record["tx_hash"])
        assert receipt["status"] == 1, record
        assert receipt["blockNumber"] == record["block_height"], record
        assert [e["transactionHash"].to_0x_hex() for e in events[rid]] == [record["tx_hash"]]
        content = registry.contract.functions.registration(rid).call()[0]
        assert "sha256:" + bytes(content).hex() == record["content_hash"]
        assert record["crd_address"] == registry.address


async def test_hundred_applications_register_exactly_once_through_a_chain_worker_sigkill(
    evm_stack: Stack, registry: Registry, evm_chain: EvmChain
) -> None:
    before = registry.work_count()
    started = time.monotonic()
    # SIGKILL the chain worker mid-submission: some works on chain, transactions it sent waiting
    # in the node's mempool (sent, not mined: the journal must find them); the stack's
    # supervisor restarts it. The moment is made, not waited for: ten works are registered,
    # then the node stops mining (a congested chain) while the other ninety are approved, and
    # the kill comes once the worker has sent some of them. (Waiting for it by chance failed:
    # under a CPU hog the worker sent 93 transactions within one block, 7 -> 100 registered.)
    ids = await _apply(evm_stack, 10)
    wait_for(lambda: registry.work_count() - before >= 10 or None, timeout=120, interval=0.05)
    rpc_call(evm_chain.node.url, "miner_stop")
    try:
        ids += await _apply(evm_stack, 90)
        try:
            in_mempool = wait_for(lambda: registry.pending_transactions() or None, timeout=120, interval=0.05)
        except AssertionError as exc:
            chain_log = evm_stack.logs(["chain"])
            raise AssertionError(f"the worker sent nothing while mining stopped\n{chain_log}") from exc
        evm_stack.worker("chain").kill()
        killed_at = registry.work_count() - before
    finally:
        rpc_call(evm_chain.node.url, "miner_start")
    assert killed_at < 100, "the kill came after submission ended"

    records = [await record_when(evm_stack, rid, lambda r: r.get("avcc_code"), wait_s=240) for rid in ids]
    elapsed = time.monotonic() - started
    assert registry.work_count() - before == 100
    events = _registered_by_stack(registry, set(ids))
    assert len(events) == 100 and all(len(v) == 1 for v in events.values())
    _assert_on_chain(registry, records)
    print(f"\n100 applications -> 100 registrations in {elapsed:.1f}s")
    print(f"chain worker SIGKILLed at {killed_at} registrations, {in_mempool} of its txs in the mempool")


def _dead_letters(bootstrap: str, record_ids: set[int]) -> list[Any]:
    """Messages of ``record_ids`` in the DLQ topic (read to its end offsets: every record is issued
    by then, so whatever failed on its way was dead-lettered before)."""
    keys = {str(i).encode() for i in record_ids}
    return [m for m in _read_all(bootstrap, [DLQ.name]) if m.key() in keys]


async def test_node_stopped_for_20s_during_submission_records_wait_then_complete(
    evm_stack: Stack, registry: Registry, evm_chain: EvmChain
) -> None:
    before = registry.work_count()
    chain_log = evm_stack.worker("chain").log_path
    log_start = chain_log.stat().st_size
    # Two waves: the first is being registered when the node stops; the second is approved
    # while it is down, so its submissions can only fail and wait (however fast the first went).
    ids = await _apply(evm_stack, 10)
    wait_for(lambda: registry.work_count() > before or None, timeout=120, interval=0.05)
    evm_chain.node.stop()
    stopped = time.monotonic()
    ids += await _apply(evm_stack, 10)
    await asyncio.sleep(max(0.0, 20 - (time.monotonic() - stopped)))
    evm_chain.node.start()
    outage = time.monotonic() - stopped
    registered_during = registry.work_count() - before  # read after the restart: an upper bound

    records = [await record_when(evm_stack, rid, lambda r: r.get("avcc_code"), wait_s=180) for rid in ids]
    assert registry.work_count() - before == 20
    events = _registered_by_stack(registry, set(ids))
    assert len(events) == 20 and all(len(v) == 1 for v in events.values())
    _assert_on_chain(registry, records)
    with chain_log.open("rb") as log:
        log.seek(log_start)
        retried = log.read().count(b"unreachable")
    assert retried > 0, "the records never took the retry path"
    assert _dead_letters(evm_stack.bootstrap, set(ids)) == []
    print(f"\nnode down {outage:.1f}s; {registered_during} of 20 registered by the restart, all 20 after")
    print(f"{retried} 'node unreachable' failures went through the retry path; 0 dead letters")


async def test_chain_verify_rereads_every_registration(evm_stack: Stack, registry: Registry) -> None:
    ids = await _apply(evm_stack, 20)
    for rid in ids:
        await record_when(evm_stack, rid, lambda r: r.get("avcc_code"), wait_s=120)
    env = {**evm_stack.env, "AVCC_DATA_DIR": str(evm_stack.root / "verify")}
    argv = [sys.executable, "-m", "app", "chain", "verify"]
    run = functools.partial(subprocess.run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    result = await asyncio.to_thread(run, argv)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("chain OK:"), result.stdout
    checked = int(result.stdout.split("chain OK: ", 1)[1].split(" records", 1)[0])
    assert checked >= 20 and checked == registry.work_count()


def test_avcc_dev_chain_evm_runs_the_lifecycle(tmp_path: Path) -> None:
    """`avcc dev --chain evm` starts ganache, deploys the registry and the code lands on chain."""
    from app.platform.http.auth import sign_request
    from app.servers.ganache import rpc_call
    from tests.integration.test_dev_stack import _get, _post, assert_none_left, terminate

    base, chain_port, broker_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
    env.update(
        {
            "AVCC_KAFKA_URL": f"kafka://127.0.0.1:{broker_port}",
            "AVCC_WEB_PORT": str(base),
            "AVCC_DATA_DIR": str(tmp_path / "var"),
            "AVCC_CHAIN_URL": f"http://127.0.0.1:{chain_port}",
        }
    )
    log = tmp_path / "dev.log"
    dev = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "dev",
            "--chain",
            "evm",
            "--groups",
            "code,review,chain",
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        body = orjson.dumps(application())
        path = "/v1/avcc/applications"
        code_url = f"http://127.0.0.1:{base + 1}"

        def ready() -> bool:
            assert dev.poll() is None, log.read_text()[-3000:]
            try:
                return all(_get(f"http://127.0.0.1:{base + o}/ready")[0] == 200 for o in (1, 2, 3))
            except OSError:
                return False

        wait_for(ready, timeout=240, interval=1.0)
        status, answer = _post(code_url + path, body, sign_request("POST", path, body, "dev", "dev-secret"))
        assert status == 202, answer
        record_path = f"/v1/avcc/records/{orjson.loads(answer)['avcc_record_id']}"

        def issued() -> dict[str, Any] | None:
            code, raw = _get(
                code_url + record_path, sign_request("GET", record_path, b"", "dev", "dev-secret")
            )
            record = orjson.loads(raw) if code == 200 else {}
            return record if record.get("avcc_code") else None

        record = wait_for(issued, timeout=120, interval=0.5)
        chain_url = env["AVCC_CHAIN_URL"]
        receipt: Any = rpc_call(chain_url, "eth_getTransactionReceipt", [record["tx_hash"]])
        assert receipt["status"] == "0x1" and int(receipt["blockNumber"], 16) == record["block_height"]
        address = (tmp_path / "var" / "chain" / "contract-address").read_text().strip()
        assert record["crd_address"] == address and receipt["to"] == address.lower()
    finally:
        children = terminate(dev)
    assert dev.returncode == 0, log.read_text()[-3000:]
    assert_none_left(children)
