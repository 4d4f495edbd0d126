"""Local hash-chain ledger: idempotent submits, persistence, block sealing, tamper detection."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from rocksdict import Options, Rdict

from app.lifecycle.chain.ledger import (
    LocalLedger,
    PendingTx,
    Receipt,
    crd_address,
    merkle_root,
    verify_ledger,
    verify_ledger_cli,
)
from app.platform.errors import LockConflict, SchemaViolation
from schemas.types import ADDRESS_PATTERN, TX_HASH_PATTERN

H = "sha256:" + "1f" * 32


def tx(key: str, **body: object) -> PendingTx:
    return PendingTx(key, "copyright_main", 10042, {"content_hash": H, **body})


def raw(db: Rdict, key: bytes) -> bytes:
    value = db[key]
    assert isinstance(value, bytes)
    return value


def tamper(path: Path, key: bytes, edit: Callable[[Any], Any]) -> None:
    db = Rdict(str(path), Options(raw_mode=True))
    try:
        db[key] = orjson.dumps(edit(orjson.loads(raw(db, key))), option=orjson.OPT_SORT_KEYS)
    finally:
        db.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger"


async def test_submit_returns_success_receipt(path: Path) -> None:
    ledger = LocalLedger(path, 10)
    receipt = await ledger.submit(tx("k1"))
    await ledger.aclose()
    assert receipt.status == "success" and receipt.error is None
    assert re.fullmatch(TX_HASH_PATTERN, receipt.tx_hash)
    assert re.fullmatch(ADDRESS_PATTERN, receipt.crd_address)
    assert receipt.crd_address == crd_address("copyright_main") != crd_address("settlement")
    assert receipt.block_height == 1
    assert receipt.tx_hash == tx("k1").tx_hash
    confirmed = receipt.confirmed()
    assert confirmed.tx_hash == receipt.tx_hash and confirmed.status == "success"
    assert verify_ledger(path).ok


async def test_resubmit_returns_original_receipt_without_new_tx(path: Path) -> None:
    ledger = LocalLedger(path, 0)
    first = await ledger.submit(tx("k1"))
    height = ledger.height
    again = await ledger.submit(tx("k1", other="payload"))
    assert again == first == ledger.receipt("k1")
    assert ledger.height == height
    await ledger.aclose()
    result = verify_ledger(path)
    assert (result.ok, result.transactions) == (True, 1)


async def test_concurrent_same_key_one_tx(path: Path) -> None:
    ledger = LocalLedger(path, 20)
    receipts = await asyncio.gather(*(ledger.submit(tx("same")) for _ in range(50)))
    more = await asyncio.gather(*(ledger.submit(tx(f"k{i}")) for i in range(30)))
    await ledger.aclose()
    assert len(set(receipts)) == 1
    assert len({r.tx_hash for r in more}) == 30
    result = verify_ledger(path)
    assert (result.ok, result.transactions) == (True, 31)


async def test_restart_persistence(path: Path) -> None:
    ledger = LocalLedger(path, 0)
    first = await ledger.submit(tx("k1"))
    await ledger.aclose()
    reopened = LocalLedger(path, 0)
    assert reopened.receipt("k1") == first
    assert await reopened.submit(tx("k1")) == first
    second = await reopened.submit(tx("k2"))
    assert second.block_height == first.block_height + 1
    await reopened.aclose()
    result = verify_ledger(path)
    assert (result.ok, result.blocks, result.transactions) == (True, 3, 2)


async def test_single_writer(path: Path) -> None:
    ledger = LocalLedger(path, 0)
    with pytest.raises(LockConflict):
        LocalLedger(path, 0)
    await ledger.submit(tx("k1"))
    assert verify_ledger(path).ok  # read-only verification while the writer is open
    await ledger.aclose()


async def test_failed_tx_status(path: Path) -> None:
    ledger = LocalLedger(path, 0)
    bad = await ledger.submit(tx("bad", simulate_revert=True))
    good = await ledger.submit(tx("good", simulate_revert=False))
    await ledger.aclose()
    assert (bad.status, bad.error) == ("failed", "reverted")
    assert good.status == "success"
    assert bad.confirmed().error == "reverted"
    assert verify_ledger(path).ok


async def test_custom_revert_rule(path: Path) -> None:
    ledger = LocalLedger(path, 0, revert_rule=lambda t: "out of gas" if t.avcc_record_id == 7 else None)
    receipt = await ledger.submit(PendingTx("x", "settlement", 7, {}))
    await ledger.aclose()
    assert (receipt.status, receipt.error, receipt.chain_type) == ("failed", "out of gas", "settlement")


async def test_block_interval_respected(path: Path) -> None:
    interval = 80
    ledger = LocalLedger(path, interval)
    start = time.monotonic()
    a = await ledger.submit(tx("a"))
    b = await ledger.submit(tx("b"))
    c = await ledger.submit(tx("c"))
    elapsed_ms = (time.monotonic() - start) * 1000
    await ledger.aclose()
    assert (a.block_height, b.block_height, c.block_height) == (1, 2, 3)
    assert elapsed_ms >= 2 * interval - 5
    assert elapsed_ms < 3 * interval + 500
    db = Rdict(str(path), Options(raw_mode=True))
    stamps = [orjson.loads(raw(db, b"block:%020d" % h))["header"]["timestamp_ms"] for h in range(4)]
    db.close()
    assert all(later - earlier >= interval - 1 for earlier, later in itertools.pairwise(stamps))


async def test_batching_in_one_block(path: Path) -> None:
    ledger = LocalLedger(path, 50)
    receipts = await asyncio.gather(*(ledger.submit(tx(f"k{i}")) for i in range(7)))
    await ledger.aclose()
    assert {r.block_height for r in receipts} == {1}


async def test_close_flushes_pending(path: Path) -> None:
    ledger = LocalLedger(path, 10_000)
    ledger.seal()  # empty mempool: no block
    waiter = asyncio.create_task(ledger.submit(tx("k1")))
    await asyncio.sleep(0)
    await ledger.aclose()
    assert (await waiter).block_height == 1


async def test_non_json_body_refused(path: Path) -> None:
    ledger = LocalLedger(path, 0)
    with pytest.raises(SchemaViolation):
        await ledger.submit(PendingTx("k", "copyright_main", 1, {"x": object()}))
    await ledger.aclose()


def test_merkle_root() -> None:
    a, b, c = (hashlib.sha256(x).hexdigest() for x in (b"a", b"b", b"c"))
    ab = hashlib.sha256(bytes.fromhex(a) + bytes.fromhex(b)).digest()
    cc = hashlib.sha256(bytes.fromhex(c) * 2).digest()
    assert merkle_root([a]) == a
    assert merkle_root(["0x" + a, b]) == ab.hex()
    assert merkle_root([a, b, c]) == hashlib.sha256(ab + cc).hexdigest()
    assert merkle_root([]) == hashlib.sha256(b"").hexdigest()


def test_receipt_json_round_trip() -> None:
    receipt = Receipt(
        "k", "settlement", 1, "0x" + "a" * 64, 3, "failed", crd_address("settlement"), "reverted"
    )
    assert Receipt.from_json(receipt.to_json()) == receipt
    assert receipt.confirmed("ins-1").instruction_id == "ins-1"


async def _filled(path: Path) -> None:
    ledger = LocalLedger(path, 0)
    await asyncio.gather(*(ledger.submit(tx(f"k{i}")) for i in range(3)))
    await ledger.submit(tx("k9", simulate_revert=True))
    await ledger.aclose()


def _set_body(block: Any) -> Any:
    block["txs"][0]["tx"]["body"]["content_hash"] = "sha256:" + "2f" * 32
    return block


def _set_hash_too(block: Any) -> Any:
    entry = _set_body(block)["txs"][0]
    entry["tx_hash"] = (
        "0x" + hashlib.sha256(orjson.dumps(entry["tx"], option=orjson.OPT_SORT_KEYS)).hexdigest()
    )
    return block


def _set_status(block: Any) -> Any:
    block["txs"][0].update(status="success", error=None)
    return block


@pytest.mark.parametrize(
    ("height", "edit", "message"),
    [
        (1, _set_body, "tx_hash does not match"),
        (1, _set_hash_too, "merkle root mismatch"),
        (2, _set_status, "receipts root mismatch"),
        (
            1,
            lambda b: {**b, "header": {**b["header"], "timestamp_ms": b["header"]["timestamp_ms"] + 1}},
            "block hash",
        ),
        (2, lambda b: {**b, "header": {**b["header"], "prev_hash": "0" * 64}}, "prev_hash"),
    ],
)
async def test_tamper_detected(
    path: Path, height: int, edit: Callable[[Any], Any], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await _filled(path)
    assert verify_ledger_cli(path) == 0
    assert capsys.readouterr().out.strip() == "ledger OK: 3 blocks, 4 transactions"
    tamper(path, b"block:%020d" % height, edit)
    result = verify_ledger(path)
    assert not result.ok and message in (result.error or "")
    assert verify_ledger_cli(path) == 1
    assert "CORRUPT" in capsys.readouterr().out


async def test_missing_block_and_index_tamper_detected(path: Path) -> None:
    await _filled(path)
    tamper(path, b"idem:k0", lambda r: {**r, "block_height": 99})
    assert "index" in (verify_ledger(path).error or "")
    db = Rdict(str(path), Options(raw_mode=True))
    del db[b"block:%020d" % 1]
    db.close()
    assert "contiguous" in (verify_ledger(path).error or "")


def test_verify_missing_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not verify_ledger(tmp_path / "nope").ok
    monkeypatch.setenv("AVCC_DATA_DIR", str(tmp_path))
    from app.platform.settings import get_settings

    get_settings.cache_clear()
    try:
        assert verify_ledger_cli() == 1
    finally:
        get_settings.cache_clear()
    assert "no ledger" in capsys.readouterr().out
