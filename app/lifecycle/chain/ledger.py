"""Chain backends: the ``ChainBackend`` protocol and a local append-only hash-chain ledger on RocksDB.

Storage (RocksDB raw mode, one writer per path, enforced by RocksDB's LOCK file):

* ``block:<height:020d>`` -> canonical JSON ``{"hash", "header", "txs"}``; ``header`` is
  ``{height, prev_hash, merkle_root, receipts_root, timestamp_ms, tx_count}`` and ``hash`` is
  ``sha256(canonical header)`` (hex). Height 0 is an empty genesis block (``prev_hash`` = 64 zeros).
* each tx entry is ``{"tx", "tx_hash", "status", "error"}``; ``tx_hash`` = ``0x`` + sha256 of the
  canonical ``tx`` document; ``merkle_root`` is a binary sha256 Merkle tree over the tx hashes
  (odd levels duplicate the last node; empty tree = sha256 of nothing); ``receipts_root`` the same
  over ``sha256(canonical {tx_hash, status, error})`` so a tampered status is detected too.
* ``idem:<idempotency_key>`` -> the receipt JSON; ``meta:tip`` -> ``{height, hash, timestamp_ms}``.

A block and its index entries are written in one synced ``WriteBatch``. Canonical JSON is orjson
with sorted keys and no spaces. The ledger is asyncio-only (one event loop, no threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from app.lifecycle.chain.blocks import (
    GENESIS_PREV,
    TIP_KEY,
    PendingTx,
    Receipt,
    TxStatus,
    block_key,
    canonical_json,
    crd_address,
    idem_key,
    merkle_root,
    receipt_leaf,
    sha256_hex,
)
from app.lifecycle.chain.verify import VerifyResult, verify_ledger, verify_ledger_cli
from app.platform.errors import DependencyUnavailable, LockConflict, SchemaViolation

__all__ = [
    "ChainBackend",
    "LocalLedger",
    "PendingTx",
    "Receipt",
    "RevertRule",
    "TxStatus",
    "VerifyResult",
    "canonical_json",
    "crd_address",
    "merkle_root",
    "open_store",
    "simulate_revert",
    "verify_ledger",
    "verify_ledger_cli",
]

#: Decides whether a transaction reverts: an error message, or ``None`` for success.
RevertRule = Callable[[PendingTx], str | None]


class ChainBackend(Protocol):
    """A chain that notarises transactions, idempotent by ``idempotency_key``."""

    async def submit(self, tx: PendingTx) -> Receipt:
        """Put ``tx`` on chain and wait for its receipt; a known key returns the original receipt."""
        ...

    def receipt(self, idempotency_key: str) -> Receipt | None:
        """The receipt of a confirmed key, or ``None``."""
        ...

    def close(self) -> None:
        """Release the backend."""
        ...


def simulate_revert(tx: PendingTx) -> str | None:
    """Default revert rule (failure injection): ``body["simulate_revert"] is True`` reverts."""
    return "reverted" if tx.body.get("simulate_revert") is True else None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def open_store(path: Path, what: str) -> Rdict:
    """Open (create) the single-writer raw RocksDB store of the ``what`` at ``path``.

    Another writer holding it raises ``LockConflict``; any other failure ``DependencyUnavailable``.
    """
    path.mkdir(parents=True, exist_ok=True)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    try:
        return Rdict(str(path), options)
    except Exception as exc:
        if "lock" in str(exc).lower():
            raise LockConflict(f"{what} {path} is open by another writer: {exc}") from exc
        raise DependencyUnavailable(f"cannot open {what} {path}: {exc}") from exc


class LocalLedger:
    """A single-writer hash-chain ledger on disk; blocks are sealed at most every ``block_interval_ms``.

    ``submit`` queues the tx in the mempool and waits for the block that contains it. A background
    task (started on demand) seals a block once the interval since the previous block has elapsed.
    Concurrent submits of one key share one transaction.
    """

    def __init__(
        self,
        path: Path,
        block_interval_ms: int,
        *,
        revert_rule: RevertRule = simulate_revert,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        if block_interval_ms < 0:
            raise ValueError("block_interval_ms must be >= 0")
        self.path = path
        self.block_interval_ms = block_interval_ms
        self._revert_rule = revert_rule
        self._clock_ms = clock_ms
        self._db = open_store(path, "ledger")
        self._sync = WriteOptions()
        self._sync.sync = True
        self._mempool: list[PendingTx] = []
        self._waiting: dict[str, asyncio.Future[Receipt]] = {}
        self._sealer: asyncio.Task[None] | None = None
        self._closed = False
        tip = self._db.get(TIP_KEY)
        if tip is None:
            self._tip_height, self._tip_hash, self._tip_ts = -1, GENESIS_PREV, 0
            self._write_block([])
        else:
            data = orjson.loads(tip)
            self._tip_height, self._tip_hash, self._tip_ts = (
                data["height"],
                data["hash"],
                data["timestamp_ms"],
            )

    @property
    def height(self) -> int:
        """Height of the last sealed block (0 = genesis only)."""
        return self._tip_height

    def receipt(self, idempotency_key: str) -> Receipt | None:
        """The receipt of a sealed transaction, or ``None``."""
        self._check_open()
        raw = self._db.get(idem_key(idempotency_key))
        return None if raw is None else Receipt.from_json(orjson.loads(raw))

    async def submit(self, tx: PendingTx) -> Receipt:
        """Queue ``tx`` and return its receipt once sealed; a known key returns the original receipt."""
        self._check_open()
        try:
            tx.tx_hash  # noqa: B018 - validates that the body is JSON-able before queueing
        except TypeError as exc:
            raise SchemaViolation(f"tx body is not JSON-serialisable: {exc}", ["body"]) from exc
        done = self.receipt(tx.idempotency_key)
        if done is not None:
            return done
        future = self._waiting.get(tx.idempotency_key)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._waiting[tx.idempotency_key] = future
            self._mempool.append(tx)
            if self._sealer is None or self._sealer.done():
                self._sealer = asyncio.create_task(self._run_sealer(), name=f"ledger-sealer:{self.path}")
        return await asyncio.shield(future)

    def seal(self) -> int | None:
        """Seal the mempool into a block now (ignoring the interval); its height, or ``None`` if empty."""
        self._check_open()
        if not self._mempool:
            return None
        txs, self._mempool = self._mempool, []
        try:
            receipts = self._write_block(txs)
        except Exception as exc:
            failure = DependencyUnavailable(f"ledger {self.path} write failed: {exc}")
            for tx in txs:
                self._settle(tx.idempotency_key, failure)
            raise failure from exc
        for receipt in receipts:
            self._settle(receipt.idempotency_key, receipt)
        return self._tip_height

    def close(self) -> None:
        """Seal what is pending (waiters get their receipts), stop the sealer and close the store."""
        if self._closed:
            return
        with contextlib.suppress(DependencyUnavailable):
            self.seal()
        self._closed = True
        if self._sealer is not None and not self._sealer.done():
            self._sealer.cancel()
        self._db.close()

    async def aclose(self) -> None:
        """:meth:`close`, then wait for the sealer task to finish."""
        sealer = self._sealer
        self.close()
        if sealer is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await sealer

    def _check_open(self) -> None:
        if self._closed:
            raise DependencyUnavailable(f"ledger {self.path} is closed")

    def _settle(self, key: str, outcome: Receipt | BaseException) -> None:
        future = self._waiting.pop(key, None)
        if future is None or future.done():
            return
        if isinstance(outcome, Receipt):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)

    async def _run_sealer(self) -> None:
        while self._mempool and not self._closed:
            delay_ms = self._tip_ts + self.block_interval_ms - self._clock_ms()
            if delay_ms > 0:
                await asyncio.sleep(delay_ms / 1000)
            if self._mempool and not self._closed:
                with contextlib.suppress(DependencyUnavailable):  # already delivered to the waiters
                    self.seal()

    def _write_block(self, txs: Sequence[PendingTx]) -> list[Receipt]:
        height = self._tip_height + 1
        timestamp = max(self._clock_ms(), self._tip_ts)
        entries: list[dict[str, Any]] = []
        receipts: list[Receipt] = []
        for tx in txs:
            error = self._revert_rule(tx)
            status: TxStatus = "failed" if error else "success"
            tx_hash = tx.tx_hash
            entries.append({"tx": tx.document(), "tx_hash": tx_hash, "status": status, "error": error})
            receipts.append(
                Receipt(
                    tx.idempotency_key,
                    tx.chain_type,
                    tx.avcc_record_id,
                    tx_hash,
                    height,
                    status,
                    crd_address(tx.chain_type),
                    error,
                )
            )
        header = {
            "height": height,
            "prev_hash": self._tip_hash,
            "merkle_root": merkle_root([e["tx_hash"] for e in entries]),
            "receipts_root": merkle_root(
                [receipt_leaf(e["tx_hash"], e["status"], e["error"]) for e in entries]
            ),
            "timestamp_ms": timestamp,
            "tx_count": len(entries),
        }
        block_hash = sha256_hex(canonical_json(header))
        batch = WriteBatch(raw_mode=True)
        batch.put(block_key(height), canonical_json({"hash": block_hash, "header": header, "txs": entries}))
        for receipt in receipts:
            batch.put(idem_key(receipt.idempotency_key), canonical_json(receipt.to_json()))
        batch.put(TIP_KEY, canonical_json({"height": height, "hash": block_hash, "timestamp_ms": timestamp}))
        self._db.write(batch, self._sync)
        self._tip_height, self._tip_hash, self._tip_ts = height, block_hash, timestamp
        return receipts
