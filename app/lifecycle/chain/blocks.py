"""Block format of the local ledger: canonical JSON, hashes, Merkle roots, keys, transactions, receipts.

Shared by the writer (:mod:`app.lifecycle.chain.ledger`) and the checker
(:mod:`app.lifecycle.chain.verify`); the storage layout is described in the ledger's docstring.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from schemas.chain import ChainTxConfirmed
from schemas.types import ChainType

__all__ = [
    "BLOCK_PREFIX",
    "EMPTY_ROOT",
    "GENESIS_PREV",
    "IDEM_PREFIX",
    "TIP_KEY",
    "PendingTx",
    "Receipt",
    "TxStatus",
    "block_key",
    "canonical_json",
    "crd_address",
    "idem_key",
    "merkle_root",
    "receipt_leaf",
    "sha256_hex",
]

TxStatus = Literal["success", "failed"]

TIP_KEY: Final = b"meta:tip"
BLOCK_PREFIX: Final = b"block:"
IDEM_PREFIX: Final = b"idem:"
GENESIS_PREV: Final = "0" * 64
EMPTY_ROOT: Final = hashlib.sha256(b"").hexdigest()


def canonical_json(document: Any) -> bytes:
    """Canonical JSON: orjson, keys sorted (recursively), no spaces."""
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)


def sha256_hex(data: bytes) -> str:
    """Lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def crd_address(chain_type: str) -> str:
    """The copyright registry (CRD) contract address of a chain: ``0x`` + 40 hex of sha256."""
    return "0x" + sha256_hex(b"avcc-crd:" + chain_type.encode())[:40]


def merkle_root(hashes: Sequence[str]) -> str:
    """Binary sha256 Merkle root (hex) of hex hashes (``0x`` optional); odd levels duplicate the last."""
    if not hashes:
        return EMPTY_ROOT
    level = [bytes.fromhex(h.removeprefix("0x")) for h in hashes]
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        level = [hashlib.sha256(level[i] + level[i + 1]).digest() for i in range(0, len(level), 2)]
    return level[0].hex()


def receipt_leaf(tx_hash: str, status: str, error: str | None) -> str:
    """Leaf of the receipts Merkle tree: sha256 of the canonical ``{tx_hash, status, error}``."""
    return sha256_hex(canonical_json({"tx_hash": tx_hash, "status": status, "error": error}))


def block_key(height: int) -> bytes:
    """RocksDB key of the block at ``height``."""
    return BLOCK_PREFIX + b"%020d" % height


def idem_key(idempotency_key: str) -> bytes:
    """RocksDB key of the receipt of ``idempotency_key`` in the idempotency index."""
    return IDEM_PREFIX + idempotency_key.encode()


@dataclass(frozen=True)
class PendingTx:
    """A transaction to put on chain; ``body`` must be JSON-able (the evidence/settlement part)."""

    idempotency_key: str
    chain_type: ChainType
    avcc_record_id: int
    body: Mapping[str, Any]

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
        return "0x" + sha256_hex(canonical_json(self.document()))


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
