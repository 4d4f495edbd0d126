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
import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import orjson
from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from app.platform.errors import DependencyUnavailable, LockConflict, SchemaViolation
from app.platform.settings import get_settings
from schemas.chain import ChainTxConfirmed, ChainTxPending
from schemas.types import ChainType

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
    "simulate_revert",
    "verify_ledger",
    "verify_ledger_cli",
]

TxStatus = Literal["success", "failed"]
#: Decides whether a transaction reverts: an error message, or ``None`` for success.
RevertRule = Callable[["PendingTx"], str | None]

_TIP_KEY: Final = b"meta:tip"
_BLOCK_PREFIX: Final = b"block:"
_IDEM_PREFIX: Final = b"idem:"
_GENESIS_PREV: Final = "0" * 64
_EMPTY_ROOT: Final = hashlib.sha256(b"").hexdigest()


def canonical_json(document: Any) -> bytes:
    """Canonical JSON: orjson, keys sorted (recursively), no spaces."""
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def crd_address(chain_type: str) -> str:
    """The copyright registry (CRD) contract address of a chain: ``0x`` + 40 hex of sha256."""
    return "0x" + _sha(b"avcc-crd:" + chain_type.encode())[:40]


def merkle_root(hashes: Sequence[str]) -> str:
    """Binary sha256 Merkle root (hex) of hex hashes (``0x`` optional); odd levels duplicate the last."""
    if not hashes:
        return _EMPTY_ROOT
    level = [bytes.fromhex(h.removeprefix("0x")) for h in hashes]
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        level = [hashlib.sha256(level[i] + level[i + 1]).digest() for i in range(0, len(level), 2)]
    return level[0].hex()


def _receipt_leaf(tx_hash: str, status: str, error: str | None) -> str:
    return _sha(canonical_json({"tx_hash": tx_hash, "status": status, "error": error}))


@dataclass(frozen=True)
class PendingTx:
    """A transaction to put on chain; ``body`` must be JSON-able (the evidence/settlement part)."""

    idempotency_key: str
    chain_type: ChainType
    avcc_record_id: int
    body: Mapping[str, Any]

    @classmethod
    def from_message(cls, message: ChainTxPending) -> PendingTx:
        """The transaction of a ``topic.chain.tx.pending`` payload."""
        part = message.evidence if message.chain_type == "copyright_main" else message.settlement
        body = part.model_dump(mode="json") if part is not None else {}
        return cls(message.idempotency_key, message.chain_type, message.avcc_record_id, body)

    def document(self) -> dict[str, Any]:
        """The tx document that is hashed and stored."""
        return {
            "idempotency_key": self.idempotency_key,
            "chain_type": self.chain_type,
            "avcc_record_id": self.avcc_record_id,
            "body": dict(self.body),
        }

    @property
    def tx_hash(self) -> str:
        """``0x`` + sha256 of the canonical tx document."""
        return "0x" + _sha(canonical_json(self.document()))


@dataclass(frozen=True)
class Receipt:
    """The on-chain outcome of one transaction."""

    idempotency_key: str
    chain_type: ChainType
    avcc_record_id: int
    tx_hash: str
    block_height: int
    status: TxStatus
    crd_address: str
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form (stored in the idempotency index)."""
        return {
            "idempotency_key": self.idempotency_key,
            "chain_type": self.chain_type,
            "avcc_record_id": self.avcc_record_id,
            "tx_hash": self.tx_hash,
            "block_height": self.block_height,
            "status": self.status,
            "crd_address": self.crd_address,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Receipt:
        """Inverse of :meth:`to_json`."""
        return cls(**data)

    def confirmed(self, instruction_id: str | None = None) -> ChainTxConfirmed:
        """The ``topic.chain.tx.confirmed`` payload (``instruction_id`` for settlements)."""
        return ChainTxConfirmed(
            avcc_record_id=self.avcc_record_id,
            chain_type=self.chain_type,
            tx_hash=self.tx_hash,
            block_height=self.block_height,
            status=self.status,
            crd_address=self.crd_address,
            idempotency_key=self.idempotency_key,
            instruction_id=instruction_id,
            error=self.error,
        )


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


def _block_key(height: int) -> bytes:
    return _BLOCK_PREFIX + b"%020d" % height


def _idem_key(idempotency_key: str) -> bytes:
    return _IDEM_PREFIX + idempotency_key.encode()


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options


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
        path.mkdir(parents=True, exist_ok=True)
        try:
            self._db = Rdict(str(path), _options())
        except Exception as exc:
            if "lock" in str(exc).lower():
                raise LockConflict(f"ledger {path} is open by another writer: {exc}") from exc
            raise DependencyUnavailable(f"cannot open ledger {path}: {exc}") from exc
        self._sync = WriteOptions()
        self._sync.sync = True
        self._mempool: list[PendingTx] = []
        self._waiting: dict[str, asyncio.Future[Receipt]] = {}
        self._sealer: asyncio.Task[None] | None = None
        self._closed = False
        tip = self._db.get(_TIP_KEY)
        if tip is None:
            self._tip_height, self._tip_hash, self._tip_ts = -1, _GENESIS_PREV, 0
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
        raw = self._db.get(_idem_key(idempotency_key))
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
                [_receipt_leaf(e["tx_hash"], e["status"], e["error"]) for e in entries]
            ),
            "timestamp_ms": timestamp,
            "tx_count": len(entries),
        }
        block_hash = _sha(canonical_json(header))
        batch = WriteBatch(raw_mode=True)
        batch.put(_block_key(height), canonical_json({"hash": block_hash, "header": header, "txs": entries}))
        for receipt in receipts:
            batch.put(_idem_key(receipt.idempotency_key), canonical_json(receipt.to_json()))
        batch.put(_TIP_KEY, canonical_json({"height": height, "hash": block_hash, "timestamp_ms": timestamp}))
        self._db.write(batch, self._sync)
        self._tip_height, self._tip_hash, self._tip_ts = height, block_hash, timestamp
        return receipts


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


class _Corrupt(Exception):
    pass


def _prefixed(db: Rdict, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    for key, value in db.items(from_key=prefix):
        if not isinstance(key, bytes) or not key.startswith(prefix):
            return
        yield key, bytes(value)


def _verify(db: Rdict, counts: list[int]) -> None:
    """Raise ``_Corrupt`` at the first inconsistency; ``counts`` = [blocks, transactions] so far."""
    raw_tip = db.get(_TIP_KEY)
    if raw_tip is None:
        raise _Corrupt("missing tip record")
    tip = orjson.loads(raw_tip)
    prev_hash, prev_ts = _GENESIS_PREV, 0
    seen: dict[str, dict[str, Any]] = {}
    for height, (key, value) in enumerate(_prefixed(db, _BLOCK_PREFIX)):
        where = f"block {height}"
        if key != _block_key(height):
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
            if entry["tx_hash"] != "0x" + _sha(canonical_json(tx)):
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
        leaves = [_receipt_leaf(e["tx_hash"], e["status"], e["error"]) for e in entries]
        if header["receipts_root"] != merkle_root(leaves):
            raise _Corrupt(f"{where}: receipts root mismatch")
        if block["hash"] != _sha(canonical_json(header)):
            raise _Corrupt(f"{where}: block hash mismatch")
        prev_hash, prev_ts = block["hash"], header["timestamp_ms"]
        counts[0] += 1
        counts[1] += len(entries)
    if counts[0] == 0:
        raise _Corrupt("no genesis block")
    if tip["height"] != counts[0] - 1 or tip["hash"] != prev_hash:
        raise _Corrupt(f"tip record (height {tip['height']}) does not match the last block")
    indexed = 0
    for key, value in _prefixed(db, _IDEM_PREFIX):
        indexed += 1
        name = key[len(_IDEM_PREFIX) :].decode(errors="replace")
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
