"""Write-ahead journal of the EVM backend: signed transactions before they are sent, and receipts.

A transaction is journaled (synced to disk) *before* it is broadcast, so a worker that dies
between sending and seeing it mined finds it again on restart: it polls the receipts of every
signed version (replacements included), rebroadcasts the raw transaction when the node forgot
it, and never signs a second registration while one may still be mined. Confirmed receipts are
kept so :meth:`~app.lifecycle.chain.evm.EvmBackend.receipt` answers without the node.

RocksDB raw mode, one writer per path: ``sent:<key>`` -> :class:`SentTx` JSON,
``done:<key>`` -> receipt JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson
from rocksdict import WriteBatch, WriteOptions

from app.lifecycle.chain.blocks import Receipt, canonical_json
from app.lifecycle.chain.ledger import open_store

__all__ = ["SentTx", "TxJournal"]

_SENT = b"sent:"
_DONE = b"done:"


@dataclass
class SentTx:
    """A signed transaction of one idempotency key: its nonce and every version signed so far."""

    nonce: int
    gas_price: int
    gas: int
    raw: str
    hashes: list[str] = field(default_factory=list)
    #: Wall-clock ms when the latest version was signed (the replacement timeout runs from here,
    #: so a restarted worker does not start the wait anew).
    sent_ms: int = 0
    #: Recipient and call data, to sign a replacement without the event that asked for it.
    to: str = ""
    data: str = "0x"

    def replaced(self, tx_hash: str, raw: str, gas_price: int, now_ms: int) -> SentTx:
        """The entry after signing a replacement (same nonce and gas limit, higher gas price)."""
        return SentTx(
            self.nonce, gas_price, self.gas, raw, [*self.hashes, tx_hash], now_ms, self.to, self.data
        )


class TxJournal:
    """Synced RocksDB store of sent transactions and confirmed receipts (single writer)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_store(path, "chain journal")
        self._sync = WriteOptions()
        self._sync.sync = True

    def sent(self, key: str) -> SentTx | None:
        """The signed transaction(s) of ``key`` not yet confirmed, or ``None``."""
        raw = self._db.get(_SENT + key.encode())
        return None if raw is None else SentTx(**orjson.loads(raw))

    def in_flight(self) -> dict[str, SentTx]:
        """Every journaled transaction not confirmed yet, by idempotency key."""
        entries: dict[str, SentTx] = {}
        for raw_key, raw in self._db.items(from_key=_SENT):
            if not isinstance(raw_key, bytes) or not raw_key.startswith(_SENT):
                break
            entries[raw_key[len(_SENT) :].decode()] = SentTx(**orjson.loads(raw))
        return entries

    def record_sent(self, key: str, sent: SentTx) -> None:
        """Remember ``sent`` durably (call before broadcasting it)."""
        batch = WriteBatch(raw_mode=True)
        batch.put(_SENT + key.encode(), canonical_json(asdict(sent)))
        self._db.write(batch, self._sync)

    def forget_sent(self, key: str) -> None:
        """Drop the sent entry of ``key`` (its nonce was taken by another transaction)."""
        batch = WriteBatch(raw_mode=True)
        batch.delete(_SENT + key.encode())
        self._db.write(batch, self._sync)

    def confirmed(self, key: str) -> Receipt | None:
        """The confirmed receipt of ``key``, or ``None``."""
        raw = self._db.get(_DONE + key.encode())
        return None if raw is None else Receipt.from_json(orjson.loads(raw))

    def record_confirmed(self, receipt: Receipt) -> None:
        """Store the receipt and drop the sent entry, atomically."""
        key = receipt.idempotency_key.encode()
        batch = WriteBatch(raw_mode=True)
        batch.put(_DONE + key, canonical_json(receipt.to_json()))
        batch.delete(_SENT + key)
        self._db.write(batch, self._sync)

    def close(self) -> None:
        """Close the store."""
        self._db.close()
