"""Event contracts of the AVCC pipeline: strict pydantic models, the envelope and the JSON codec."""

from __future__ import annotations

from schemas.apply import AiToolInfo, ApplyCreated
from schemas.chain import (
    ChainTxConfirmed,
    ChainTxPending,
    EvidencePayload,
    SettlementInstruction,
    SettlementSplit,
)
from schemas.codec import OrjsonCodec, dumps, loads, register_codec
from schemas.envelope import (
    Envelope,
    decode_as,
    encode_event,
    encode_payload,
    envelope_class,
    make_envelope,
)
from schemas.playback import PlaybackEvent
from schemas.review import ReviewTaskFinished
from schemas.system import AnomalyDetected, FailureMetadata, header_name
from schemas.types import (
    Address,
    ContractModel,
    EpochMillis,
    EventId,
    Identifier,
    MaCode,
    Money,
    NonNegativeMoney,
    RecordId,
    Sha256Ref,
    TxHash,
    format_money,
    parse_money,
)
from schemas.violations import to_schema_violation

__all__ = [
    "Address",
    "AiToolInfo",
    "AnomalyDetected",
    "ApplyCreated",
    "ChainTxConfirmed",
    "ChainTxPending",
    "ContractModel",
    "Envelope",
    "EpochMillis",
    "EventId",
    "EvidencePayload",
    "FailureMetadata",
    "Identifier",
    "MaCode",
    "Money",
    "NonNegativeMoney",
    "OrjsonCodec",
    "PlaybackEvent",
    "RecordId",
    "ReviewTaskFinished",
    "SettlementInstruction",
    "SettlementSplit",
    "Sha256Ref",
    "TxHash",
    "decode_as",
    "dumps",
    "encode_event",
    "encode_payload",
    "envelope_class",
    "format_money",
    "header_name",
    "loads",
    "make_envelope",
    "parse_money",
    "register_codec",
    "to_schema_violation",
]
