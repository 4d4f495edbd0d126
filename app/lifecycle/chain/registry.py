"""The AvccRegistry contract: its compiled artefact and how a chain transaction maps onto it.

``deploy/chain/AvccRegistry.sol`` is compiled by ``deploy/chain/compile.js`` (pinned solcjs)
into ``deploy/chain/AvccRegistry.json`` (ABI + bytecode, checked in; a unit test fails when it
is stale). :func:`registry_call` is pure: it says which contract function a
:class:`~app.lifecycle.chain.blocks.PendingTx` calls, with which arguments, and how its
registration is found again (the view to call and the event log to read the tx hash from).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, get_args

import orjson
from eth_utils.crypto import keccak

from app.lifecycle.chain.blocks import PendingTx, canonical_json
from app.platform.errors import SchemaViolation
from schemas.types import FinalLevel

__all__ = [
    "ARTEFACT_PATH",
    "SETTLEMENT_EVENT",
    "WORK_EVENT",
    "Artefact",
    "RegistryCall",
    "content_hash_bytes",
    "event_topic",
    "level_code",
    "load_artefact",
    "registry_call",
]

ARTEFACT_PATH: Final = Path(__file__).resolve().parents[3] / "deploy" / "chain" / "AvccRegistry.json"
#: Event signatures (topic 0 = their keccak); topic 1 is the record id / settlement key.
WORK_EVENT: Final = "WorkRegistered(uint64,bytes32,bytes32,uint8)"
SETTLEMENT_EVENT: Final = "SettlementRecorded(bytes32,uint64,bytes32)"
_LEVELS: Final[tuple[str, ...]] = get_args(FinalLevel)


@dataclass(frozen=True)
class Artefact:
    """ABI and creation bytecode of AvccRegistry."""

    abi: list[dict[str, Any]]
    bytecode: str


@lru_cache(maxsize=4)
def load_artefact(path: Path = ARTEFACT_PATH) -> Artefact:
    """The checked-in compiled contract."""
    data = orjson.loads(path.read_bytes())
    return Artefact(abi=data["abi"], bytecode=data["bytecode"])


def content_hash_bytes(ref: str) -> bytes:
    """``sha256:<64 hex>`` as the 32 bytes the contract stores."""
    digest = bytes.fromhex(ref.removeprefix("sha256:"))
    if len(digest) != 32:
        raise SchemaViolation(f"not a sha256 reference: {ref!r}", ["content_hash"])
    return digest


def event_topic(signature: str) -> str:
    """Topic 0 of an event: ``0x`` + keccak of its signature."""
    return "0x" + keccak(text=signature).hex()


def level_code(level: str) -> int:
    """A final level as the contract's ``uint8`` (1-based position in ``FinalLevel``)."""
    return _LEVELS.index(level) + 1


@dataclass(frozen=True)
class RegistryCall:
    """One transaction's contract call and how to find its registration again."""

    function: str
    args: tuple[Any, ...]
    #: The view returning the registration (its last value is the block number, 0 = none).
    view: str
    view_key: int | bytes
    #: Event signature and its indexed topic 1 (32 bytes) that identify the registering tx.
    event: str
    topic: bytes
    #: Content hash a work registration claims (checked against ``recordOf`` before sending).
    content_hash: bytes | None = None

    @property
    def topics(self) -> list[str]:
        """The log topics of the registering transaction's event: its signature, then ``topic``."""
        return [event_topic(self.event), "0x" + self.topic.hex()]


def _part(body: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The evidence/settlement part of a tx body (whole payload or the part alone)."""
    part = body.get(name, body)
    if not isinstance(part, Mapping):
        raise SchemaViolation(f"tx body has no {name} object", [name])
    return part


def registry_call(tx: PendingTx) -> RegistryCall:
    """The AvccRegistry call of ``tx``: ``registerWork`` for evidence, ``recordSettlement`` else."""
    try:
        if tx.chain_type == "copyright_main":
            evidence = _part(tx.body, "evidence")
            content = content_hash_bytes(str(evidence["content_hash"]))
            report = content_hash_bytes(str(evidence["report_hash"]))
            return RegistryCall(
                function="registerWork",
                args=(tx.avcc_record_id, content, report, level_code(str(evidence["final_level"]))),
                view="registration",
                view_key=tx.avcc_record_id,
                event=WORK_EVENT,
                topic=tx.avcc_record_id.to_bytes(32, "big"),
                content_hash=content,
            )
        settlement = _part(tx.body, "settlement")
        key = keccak(tx.idempotency_key.encode())
        instruction = hashlib.sha256(canonical_json(dict(settlement))).digest()
        return RegistryCall(
            function="recordSettlement",
            args=(key, tx.avcc_record_id, instruction),
            view="settlement",
            view_key=key,
            event=SETTLEMENT_EVENT,
            topic=key,
        )
    except (KeyError, ValueError) as exc:
        raise SchemaViolation(f"tx {tx.idempotency_key} cannot be put on chain: {exc}", ["body"]) from exc
