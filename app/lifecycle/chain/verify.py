"""Verification of the local ledger: every block re-hashed and re-linked, the index re-derived.

``avcc ledger verify`` (:func:`verify_ledger_cli`) and the crash tests use it on a ledger that is
not open for writing (RocksDB read-only).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rocksdict import AccessType, Options, Rdict

from app.lifecycle.chain.blocks import (
    BLOCK_PREFIX,
    GENESIS_PREV,
    IDEM_PREFIX,
    TIP_KEY,
    Receipt,
    block_key,
    canonical_json,
    crd_address,
    merkle_root,
    receipt_leaf,
    sha256_hex,
)
from app.platform.errors import AvccError
from app.platform.settings import get_settings

__all__ = ["VerifyResult", "verify_ledger", "verify_ledger_cli"]


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify_ledger`: counts checked so far and the first error, if any."""

    ok: bool
    blocks: int
    transactions: int
    error: str | None = None

    def summary(self) -> str:
        """One line for humans."""
        if self.ok:
            return f"ledger OK: {self.blocks} blocks, {self.transactions} transactions"
        return f"ledger CORRUPT after {self.blocks} blocks, {self.transactions} transactions: {self.error}"


class _Corrupt(AvccError):
    """The ledger's blocks or transactions do not add up (ends the verification with its error)."""


def _prefixed(db: Rdict, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    for key, value in db.items(from_key=prefix):
        if not isinstance(key, bytes) or not key.startswith(prefix):
            return
        yield key, bytes(value)


def _verify(db: Rdict, counts: list[int]) -> None:
    """Raise ``_Corrupt`` at the first inconsistency; ``counts`` = [blocks, transactions] so far."""
    raw_tip = db.get(TIP_KEY)
    if raw_tip is None:
        raise _Corrupt("missing tip record")
    tip = orjson.loads(raw_tip)
    prev_hash, prev_ts = GENESIS_PREV, 0
    seen: dict[str, dict[str, Any]] = {}
    for height, (key, value) in enumerate(_prefixed(db, BLOCK_PREFIX)):
        where = f"block {height}"
        if key != block_key(height):
            raise _Corrupt(f"{where}: heights not contiguous (found key {key.decode(errors='replace')})")
        block = orjson.loads(value)
        header, entries = block["header"], block["txs"]
        if header["height"] != height:
            raise _Corrupt(f"{where}: header height {header['height']}")
        if header["prev_hash"] != prev_hash:
            raise _Corrupt(f"{where}: prev_hash does not link to the previous block")
        if header["timestamp_ms"] < prev_ts:
            raise _Corrupt(f"{where}: timestamp goes backwards")
        if header["tx_count"] != len(entries):
            raise _Corrupt(f"{where}: tx_count {header['tx_count']} != {len(entries)}")
        for index, entry in enumerate(entries):
            tx = entry["tx"]
            if entry["tx_hash"] != "0x" + sha256_hex(canonical_json(tx)):
                raise _Corrupt(f"{where} tx {index}: tx_hash does not match its content")
            if tx["idempotency_key"] in seen:
                raise _Corrupt(f"{where} tx {index}: duplicate idempotency key {tx['idempotency_key']!r}")
            receipt = Receipt(
                tx["idempotency_key"],
                tx["chain_type"],
                tx["avcc_record_id"],
                entry["tx_hash"],
                height,
                entry["status"],
                crd_address(tx["chain_type"]),
                entry["error"],
            )
            seen[tx["idempotency_key"]] = receipt.to_json()
        if header["merkle_root"] != merkle_root([e["tx_hash"] for e in entries]):
            raise _Corrupt(f"{where}: merkle root mismatch")
        leaves = [receipt_leaf(e["tx_hash"], e["status"], e["error"]) for e in entries]
        if header["receipts_root"] != merkle_root(leaves):
            raise _Corrupt(f"{where}: receipts root mismatch")
        if block["hash"] != sha256_hex(canonical_json(header)):
            raise _Corrupt(f"{where}: block hash mismatch")
        prev_hash, prev_ts = block["hash"], header["timestamp_ms"]
        counts[0] += 1
        counts[1] += len(entries)
    if counts[0] == 0:
        raise _Corrupt("no genesis block")
    if tip["height"] != counts[0] - 1 or tip["hash"] != prev_hash:
        raise _Corrupt(f"tip record (height {tip['height']}) does not match the last block")
    indexed = 0
    for key, value in _prefixed(db, IDEM_PREFIX):
        indexed += 1
        name = key[len(IDEM_PREFIX) :].decode(errors="replace")
        if seen.get(name) != orjson.loads(value):
            raise _Corrupt(f"idempotency index entry {name!r} does not match the chain")
    if indexed != len(seen):
        raise _Corrupt(f"idempotency index has {indexed} entries for {len(seen)} transactions")


def verify_ledger(path: Path) -> VerifyResult:
    """Re-check every block: links, heights, tx hashes, Merkle roots, block hashes, unique keys, index."""
    if not (path / "CURRENT").is_file():
        return VerifyResult(False, 0, 0, f"no ledger at {path}")
    counts = [0, 0]
    try:
        db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    except Exception as exc:
        return VerifyResult(False, 0, 0, f"cannot open {path}: {exc}")
    try:
        _verify(db, counts)
    except _Corrupt as exc:
        return VerifyResult(False, counts[0], counts[1], str(exc))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        return VerifyResult(False, counts[0], counts[1], f"malformed record after block {counts[0]}: {exc!r}")
    finally:
        db.close()
    return VerifyResult(True, counts[0], counts[1])


def verify_ledger_cli(path: Path | None = None) -> int:
    """Print a one-line verification summary; 0 if the ledger is intact, else 1."""
    if path is None:
        path = get_settings().data_dir / "ledger"
    result = verify_ledger(path)
    print(result.summary())
    return 0 if result.ok else 1
