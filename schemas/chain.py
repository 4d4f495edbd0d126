"""Payloads of ``topic.chain.tx.pending`` (what to put on chain) and ``topic.chain.tx.confirmed``."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from schemas.types import (
    Address,
    BlockHeight,
    ChainType,
    ContractModel,
    EpochMillis,
    FinalLevel,
    Identifier,
    MaCode,
    NonBlankStr,
    NonNegativeMoney,
    RecordId,
    Sha256Ref,
    TxHash,
    format_money,
)

__all__ = [
    "ChainTxConfirmed",
    "ChainTxPending",
    "EvidencePayload",
    "SettlementInstruction",
    "SettlementSplit",
]


def _when(field: str, value: str, then: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema ``if``/``then`` rule: when ``field`` is ``value``, ``then`` applies."""
    return {"if": {"properties": {field: {"const": value}}, "required": [field]}, "then": then}


def _only(present: str, absent: str) -> dict[str, Any]:
    return {"required": [present], "properties": {present: {"type": "object"}, absent: {"type": "null"}}}


class EvidencePayload(ContractModel):
    """What the copyright main chain notarises for a reviewed work (存证)."""

    content_hash: Sha256Ref
    report_hash: Sha256Ref
    final_level: FinalLevel
    review_report_id: RecordId
    applicant_id: Identifier | None = None


class SettlementSplit(ContractModel):
    """One party's share of a settlement."""

    party: NonBlankStr
    address: Address
    amount_cny: NonNegativeMoney


class SettlementInstruction(ContractModel):
    """A revenue split of one work over one period, to record on the settlement chain (分账指令).

    Rules: ``period_end >= period_start``; ``sum(splits.amount_cny) == total_cny`` exactly;
    no party twice.
    """

    instruction_id: Identifier
    avcc_code: MaCode
    period_start: EpochMillis
    period_end: EpochMillis
    currency: Literal["CNY"]
    total_cny: NonNegativeMoney
    splits: Annotated[list[SettlementSplit], Field(min_length=1, max_length=1000)]

    @field_validator("period_end")
    @classmethod
    def _end_after_start(cls, value: int, info: ValidationInfo) -> int:
        start = info.data.get("period_start")
        if isinstance(start, int) and value < start:
            raise PydanticCustomError("period_order", "must be >= period_start")
        return value

    @field_validator("splits")
    @classmethod
    def _splits_add_up(cls, value: list[SettlementSplit], info: ValidationInfo) -> list[SettlementSplit]:
        parties: set[str] = set()
        for split in value:
            if split.party in parties:
                raise PydanticCustomError(
                    "duplicate_party", "party '{party}' appears twice", {"party": split.party}
                )
            parties.add(split.party)
        total = info.data.get("total_cny")
        if isinstance(total, Decimal):
            paid = sum((split.amount_cny for split in value), Decimal("0.00"))
            if paid != total:
                raise PydanticCustomError(
                    "splits_sum",
                    "sum of amount_cny ({paid}) must equal total_cny ({total})",
                    {"paid": format_money(paid), "total": format_money(total)},
                )
        return value


_PART_FOR: dict[str, str] = {"copyright_main": "evidence", "settlement": "settlement"}


def _check_part(field: str, present: bool, info: ValidationInfo) -> None:
    chain_type = info.data.get("chain_type")
    if chain_type is None:
        return  # chain_type itself is invalid and reported
    wanted = _PART_FOR[chain_type] == field
    if wanted and not present:
        raise PydanticCustomError(
            "chain_part_missing", "required when chain_type is '{chain_type}'", {"chain_type": chain_type}
        )
    if present and not wanted:
        raise PydanticCustomError(
            "chain_part_forbidden",
            "not allowed when chain_type is '{chain_type}'",
            {"chain_type": chain_type},
        )


class ChainTxPending(ContractModel):
    """A transaction to submit (chain-svc input): evidence notarisation or a settlement instruction.

    Exactly one of ``evidence`` (``chain_type="copyright_main"``) and ``settlement``
    (``chain_type="settlement"``) is present. Submission is idempotent by ``idempotency_key``.
    """

    #: The same part rule, published in the JSON Schema (``schemas/json``).
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                _when("chain_type", "copyright_main", _only("evidence", "settlement")),
                _when("chain_type", "settlement", _only("settlement", "evidence")),
            ]
        }
    )

    avcc_record_id: RecordId
    chain_type: ChainType
    idempotency_key: Identifier
    request_id: Identifier
    evidence: EvidencePayload | None = Field(default=None, validate_default=True)
    settlement: SettlementInstruction | None = Field(default=None, validate_default=True)

    @field_validator("evidence")
    @classmethod
    def _evidence_matches(cls, value: EvidencePayload | None, info: ValidationInfo) -> EvidencePayload | None:
        _check_part("evidence", value is not None, info)
        return value

    @field_validator("settlement")
    @classmethod
    def _settlement_matches(
        cls, value: SettlementInstruction | None, info: ValidationInfo
    ) -> SettlementInstruction | None:
        _check_part("settlement", value is not None, info)
        return value


class ChainTxConfirmed(ContractModel):
    """An on-chain receipt (chain-svc -> code-svc, settlement-svc) (seed 9.2.3).

    ``instruction_id`` only for ``chain_type="settlement"``; ``error`` only for ``status="failed"``.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                _when("chain_type", "copyright_main", {"properties": {"instruction_id": {"type": "null"}}}),
                _when("status", "success", {"properties": {"error": {"type": "null"}}}),
            ]
        }
    )

    avcc_record_id: RecordId
    chain_type: ChainType
    tx_hash: TxHash
    block_height: BlockHeight
    status: Literal["success", "failed"]
    crd_address: Address
    idempotency_key: Identifier | None = None
    instruction_id: Identifier | None = None
    error: Annotated[str, StringConstraints(min_length=1, max_length=2048)] | None = None

    @field_validator("instruction_id")
    @classmethod
    def _instruction_for_settlement(cls, value: str | None, info: ValidationInfo) -> str | None:
        chain_type = info.data.get("chain_type")
        if value is not None and chain_type is not None and chain_type != "settlement":
            raise PydanticCustomError("instruction_forbidden", "only allowed when chain_type is 'settlement'")
        return value

    @field_validator("error")
    @classmethod
    def _error_when_failed(cls, value: str | None, info: ValidationInfo) -> str | None:
        status = info.data.get("status")
        if value is not None and status is not None and status != "failed":
            raise PydanticCustomError("error_forbidden", "only allowed when status is 'failed'")
        return value
