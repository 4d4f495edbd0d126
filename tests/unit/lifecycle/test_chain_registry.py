"""AvccRegistry artefact and the pure parts of the EVM backend: call mapping, keys, verify comparison."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from app.dev_chain import DEV_CHAIN_PORT, dev_chain_port
from app.lifecycle.chain.backends import backend_kind
from app.lifecycle.chain.blocks import PendingTx
from app.lifecycle.chain.evm import custom_error_names
from app.lifecycle.chain.evm_verify import NotarisedRecord, OnChainWork, compare
from app.lifecycle.chain.keys import create_key_file, parse_key
from app.lifecycle.chain.registry import (
    ARTEFACT_PATH,
    SETTLEMENT_EVENT,
    WORK_EVENT,
    event_topic,
    load_artefact,
    registry_call,
)
from app.platform.errors import ConfigurationError, SchemaViolation
from app.platform.settings import Settings

CHAIN_TOOLS = ARTEFACT_PATH.parent
CONTENT = "sha256:" + hashlib.sha256(b"work").hexdigest()
REPORT = "sha256:" + hashlib.sha256(b"report").hexdigest()
CONTRACT = "0x" + "ab" * 20


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def test_checked_in_artefact_matches_a_fresh_solc_compile() -> None:
    node = shutil.which("node")
    if node is None or not (CHAIN_TOOLS / "node_modules" / "solc").is_dir():
        if _in_ci():
            pytest.fail(
                "node or deploy/chain/node_modules/solc missing (scripts/install-deps.sh)", pytrace=False
            )
        pytest.skip("solcjs not installed (npm ci in deploy/chain)")
    fresh = subprocess.run(
        [node, str(CHAIN_TOOLS / "compile.js"), "--print"], capture_output=True, check=True, timeout=300
    ).stdout
    assert fresh == ARTEFACT_PATH.read_bytes(), "AvccRegistry.json is stale: run node deploy/chain/compile.js"


def test_artefact_has_the_functions_events_and_errors_the_backend_uses() -> None:
    artefact = load_artefact()
    names = {e.get("name") for e in artefact.abi}
    for name in (
        "registerWork",
        "recordSettlement",
        "registration",
        "recordOf",
        "settlement",
        "WorkRegistered",
    ):
        assert name in names
    assert artefact.bytecode.startswith("0x") and len(artefact.bytecode) > 1000
    errors = set(custom_error_names(artefact.abi).values())
    assert {"RecordAlreadyRegistered", "ContentAlreadyRegistered", "SettlementAlreadyRecorded"} <= errors


def test_event_topic_is_keccak_of_the_signature() -> None:
    # keccak("Transfer(address,address,uint256)") is the well-known ERC-20 topic
    assert event_topic("Transfer(address,address,uint256)") == (
        "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
    )


def _evidence(record_id: int = 7, level: str = "G") -> PendingTx:
    body = {"evidence": {"content_hash": CONTENT, "report_hash": REPORT, "final_level": level}}
    return PendingTx(f"evidence-{record_id}", "copyright_main", record_id, body)


def test_evidence_registers_the_work_by_record_id_and_content_hash() -> None:
    call = registry_call(_evidence())
    assert call.function == "registerWork"
    assert call.args == (7, bytes.fromhex(CONTENT[7:]), bytes.fromhex(REPORT[7:]), 2)
    assert call.view == "registration" and call.view_key == 7
    assert call.topic == (7).to_bytes(32, "big")
    assert call.topics == [event_topic(WORK_EVENT), "0x" + "00" * 31 + "07"]
    assert call.content_hash == bytes.fromhex(CONTENT[7:])


def test_levels_map_to_distinct_nonzero_codes() -> None:
    codes = {registry_call(_evidence(level=lv)).args[3] for lv in ("P", "G", "O")}
    assert codes == {1, 2, 3}


def test_settlement_is_keyed_by_its_idempotency_key_and_hashes_the_instruction() -> None:
    body = {"settlement": {"instruction_id": "ins-1", "total_cny": "10.00"}}
    call = registry_call(PendingTx("settle-ins-1", "settlement", 9, body))
    other = registry_call(PendingTx("settle-ins-2", "settlement", 9, body))
    changed = registry_call(
        PendingTx("settle-ins-1", "settlement", 9, {"settlement": {"total_cny": "11.00"}})
    )
    assert call.function == "recordSettlement" and call.view == "settlement"
    assert call.view_key == call.topic == call.args[0] and len(call.topic) == 32
    assert call.topics == [event_topic(SETTLEMENT_EVENT), "0x" + call.topic.hex()]
    assert other.topic != call.topic
    assert changed.args[2] != call.args[2]


def test_a_malformed_evidence_body_is_a_schema_violation() -> None:
    tx = PendingTx("evidence-1", "copyright_main", 1, {"evidence": {"content_hash": "sha256:abc"}})
    with pytest.raises(SchemaViolation):
        registry_call(tx)


def test_backend_kind_follows_the_chain_url() -> None:
    assert backend_kind(Settings()) == "local"
    assert backend_kind(Settings(chain_url="http://127.0.0.1:8545")) == "evm"
    assert backend_kind(Settings(chain_url="https://node.example:443")) == "evm"
    with pytest.raises(ConfigurationError):
        backend_kind(Settings(chain_url="ws://127.0.0.1:8546"))


def test_key_file_is_created_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "chain" / "signer.key"
    key = create_key_file(path)
    assert create_key_file(path) == key
    assert path.stat().st_mode & 0o777 == 0o600
    assert parse_key("  " + key.upper().replace("0X", "") + "\n") == key
    with pytest.raises(ConfigurationError):
        parse_key("not a key")


def _record(rid: int = 1, tx: str = "0x" + "1" * 64, block: int = 5) -> NotarisedRecord:
    return NotarisedRecord(rid, frozenset({tx}), block, CONTRACT, CONTENT)


def _work(rid: int = 1, tx: str = "0x" + "1" * 64, block: int = 5) -> OnChainWork:
    return OnChainWork(rid, CONTENT, block, (tx,))


def test_compare_accepts_matching_records() -> None:
    assert compare({1: _record()}, {1: _work()}, CONTRACT.upper().replace("0X", "0x")) == []


@pytest.mark.parametrize(
    ("work", "needle"),
    [
        (OnChainWork(1, CONTENT, 0, ()), "not registered"),
        (_work(tx="0x" + "2" * 64), "announced tx"),
        (_work(block=6), "announced block"),
        (OnChainWork(1, "sha256:" + "0" * 64, 5, ("0x" + "1" * 64,)), "content hash"),
        (OnChainWork(1, CONTENT, 5, ("0x" + "1" * 64, "0x" + "3" * 64)), "2 registration events"),
    ],
    ids=["missing", "other-tx", "other-block", "other-content", "twice"],
)
def test_compare_reports_each_mismatch(work: OnChainWork, needle: str) -> None:
    problems = compare({1: _record()}, {1: work}, CONTRACT)
    assert any(needle in p for p in problems), problems


def test_compare_reports_a_foreign_crd_address() -> None:
    problems = compare({1: _record()}, {1: _work()}, "0x" + "cd" * 20)
    assert any("crd_address" in p for p in problems)


def test_artefact_json_is_what_compile_js_writes() -> None:
    data = orjson.loads(ARTEFACT_PATH.read_bytes())
    assert data["contractName"] == "AvccRegistry" and data["compiler"].startswith("solc 0.8.26")


def test_the_default_path_does_not_import_web3() -> None:
    """web3 takes about a second to import: only the EVM backend may pull it in."""
    code = (
        "import sys, agents.chain, app.cli, app.dev; "
        "print(sorted({'web3', 'eth_account'} & set(sys.modules)))"
    )
    env = {**os.environ, "AVCC_KAFKA_URL": "kafka://127.0.0.1:1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=CHAIN_TOOLS.parents[1],
    )
    assert out.stdout.strip() == "[]"


def test_dev_chain_listens_on_the_loopback_port_of_the_chain_url() -> None:
    assert dev_chain_port(Settings()) == DEV_CHAIN_PORT
    assert dev_chain_port(Settings(chain_url="http://127.0.0.1:28545")) == 28545
    with pytest.raises(ConfigurationError):
        dev_chain_port(Settings(chain_url="http://10.0.0.5:8545"))
