"""Constrained field types and the strict model base shared by every event contract."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated, Final, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

__all__ = [
    "ADDRESS_PATTERN",
    "CENT",
    "IDENTIFIER_PATTERN",
    "MAX_EPOCH_MS",
    "MA_CODE_PATTERN",
    "MIN_EPOCH_MS",
    "MONEY_LIMIT",
    "PATTERN_REASONS",
    "PLATFORM_NODE_PATTERN",
    "SHA256_PATTERN",
    "SOURCE_PATTERN",
    "TX_HASH_PATTERN",
    "Address",
    "AnomalyRule",
    "BlockHeight",
    "ChainType",
    "ContentUrl",
    "ContractModel",
    "Decision",
    "EpochMillis",
    "EventId",
    "FinalLevel",
    "Identifier",
    "MaCode",
    "MediaType",
    "Money",
    "NonBlankStr",
    "NonNegativeMoney",
    "PlatformNode",
    "PlaybackEventType",
    "RecordId",
    "Score",
    "Sha256Ref",
    "SourceName",
    "Token",
    "TxHash",
    "format_money",
    "parse_money",
]

# --- patterns (pydantic runs them with the Rust regex engine: ``$`` is end of text) ---------------

SHA256_PATTERN: Final = r"^sha256:[0-9a-f]{64}$"
TX_HASH_PATTERN: Final = r"^0x[0-9a-fA-F]{64}$"
ADDRESS_PATTERN: Final = r"^0x[0-9a-fA-F]{40}$"
MA_CODE_PATTERN: Final = r"^MA\.156\.[0-9]{1,10}\.[0-9]{1,10}/[A-Za-z0-9._-]{1,128}$"
IDENTIFIER_PATTERN: Final = r"^[A-Za-z0-9_.:-]+$"
SOURCE_PATTERN: Final = r"^[a-z][a-z0-9-]{0,63}$"
PLATFORM_NODE_PATTERN: Final = r"^[0-9]{1,16}$"
_NOT_BLANK_PATTERN: Final = r"\S"
_TOKEN_PATTERN: Final = r"^[!-~]+$"

#: Human reason for each pattern, used when a value fails to match it.
PATTERN_REASONS: Final[dict[str, str]] = {
    SHA256_PATTERN: "must be 'sha256:' followed by 64 lowercase hex digits",
    TX_HASH_PATTERN: "must be '0x' followed by 64 hex digits",
    ADDRESS_PATTERN: "must be '0x' followed by 40 hex digits",
    MA_CODE_PATTERN: "must be an MA code like 'MA.156.<issuer>.<node>/<suffix>'",
    IDENTIFIER_PATTERN: "must contain only letters, digits and '_', '.', ':', '-'",
    SOURCE_PATTERN: "must be a service name: lowercase letter, then lowercase letters, "
    "digits or '-' (at most 64)",
    PLATFORM_NODE_PATTERN: "must be 1 to 16 decimal digits",
    _NOT_BLANK_PATTERN: "must not be blank",
    _TOKEN_PATTERN: "must contain only printable ASCII characters without spaces",
}

#: 2000-01-01T00:00:00Z and 2100-01-01T00:00:00Z in epoch milliseconds.
MIN_EPOCH_MS: Final = 946_684_800_000
MAX_EPOCH_MS: Final = 4_102_444_800_000
_INT63_MAX: Final = 2**63 - 1


class ContractModel(BaseModel):
    """Base of every event contract: strict types, no unknown fields, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)


# --- strings ----------------------------------------------------------------------------------

Sha256Ref = Annotated[str, StringConstraints(pattern=SHA256_PATTERN)]
TxHash = Annotated[str, StringConstraints(pattern=TX_HASH_PATTERN)]
Address = Annotated[str, StringConstraints(pattern=ADDRESS_PATTERN)]
MaCode = Annotated[str, StringConstraints(max_length=160, pattern=MA_CODE_PATTERN)]
#: Request ids, idempotency keys, instruction ids: 1-128 of ``[A-Za-z0-9_.:-]``.
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=IDENTIFIER_PATTERN)]
SourceName = Annotated[str, StringConstraints(pattern=SOURCE_PATTERN)]
PlatformNode = Annotated[str, StringConstraints(pattern=PLATFORM_NODE_PATTERN)]
#: Free text that must contain a non-space character (at most 128 characters).
NonBlankStr = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_NOT_BLANK_PATTERN)]
#: An opaque id supplied by a partner: 1-128 printable ASCII characters, no spaces.
Token = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_TOKEN_PATTERN)]

_CONTENT_URL = re.compile(
    r"(?:s3|oss|https?)://[^\s/?#@\x00-\x1f\x7f]+/[^\s\x00-\x1f\x7f]+"
    r"|ipfs://[^\s/?#@\x00-\x1f\x7f]+(?:/[^\s\x00-\x1f\x7f]*)?"
)


def _check_content_url(value: str) -> str:
    if _CONTENT_URL.fullmatch(value) is None:
        raise PydanticCustomError(
            "content_url",
            "must be an s3://, oss://, http(s):// or ipfs:// URL with a host and a path",
        )
    return value


#: The same rule as ``_CONTENT_URL``, spelled for JSON Schema (published in ``schemas/json``).
_CONTENT_URL_SCHEMA: Final = {
    "type": "string",
    "minLength": 1,
    "maxLength": 2048,
    "pattern": f"^(?:{_CONTENT_URL.pattern})$",
}

ContentUrl = Annotated[
    str,
    StringConstraints(min_length=1, max_length=2048),
    AfterValidator(_check_content_url),
    WithJsonSchema(_CONTENT_URL_SCHEMA),
]

# --- integers ---------------------------------------------------------------------------------

#: A database id: 1 .. 2**63-1 (a JSON integer on the wire).
RecordId = Annotated[int, Field(ge=1, le=_INT63_MAX)]
BlockHeight = Annotated[int, Field(ge=0, le=_INT63_MAX)]
#: Epoch milliseconds between 2000-01-01 and 2100-01-01 (UTC).
EpochMillis = Annotated[int, Field(ge=MIN_EPOCH_MS, lt=MAX_EPOCH_MS)]
#: A review score: a finite JSON number in [0, 100].
Score = Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)]

# --- enums ------------------------------------------------------------------------------------

ChainType = Literal["copyright_main", "settlement"]
Decision = Literal["approved", "rejected", "need_human"]
FinalLevel = Literal["P", "G", "O"]
MediaType = Literal["audio", "video"]
PlaybackEventType = Literal["play", "complete", "purchase"]
AnomalyRule = Literal[
    "traffic_spike",
    "user_replay",
    "impossible_duration",
    "revenue_out_of_bounds",
    "node_share_jump",
]

# --- event ids --------------------------------------------------------------------------------

_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _parse_event_id(value: object) -> UUID:
    if isinstance(value, UUID):
        return value
    if isinstance(value, str) and _CANONICAL_UUID.fullmatch(value) is not None:
        return UUID(value)
    raise PydanticCustomError("event_id", "must be a canonical lowercase UUID string (8-4-4-4-12 hex digits)")


#: A UUID; on the wire only its canonical lowercase 36-character form is accepted and written.
EventId = Annotated[
    UUID,
    PlainValidator(_parse_event_id),
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "uuid", "pattern": f"^{_CANONICAL_UUID.pattern}$"}),
]

# --- money ------------------------------------------------------------------------------------

CENT: Final = Decimal("0.01")
#: Money amounts are below 10**12 CNY in absolute value (12 integer digits).
MONEY_LIMIT: Final = Decimal(10**12)
_ZERO: Final = Decimal("0.00")
_MONEY_TEXT = re.compile(r"-?[0-9]{1,12}(?:\.[0-9]{1,2})?")
_PLACES_REASON: Final = "float-rounded money: use at most 2 decimal places"


def parse_money(value: object) -> Decimal:
    """Exact amount from an int, a ``"12.50"`` string, a float with <= 2 decimals or a Decimal.

    Raises ``PydanticCustomError`` (inside validation it becomes a field error).
    """
    if isinstance(value, bool):
        raise PydanticCustomError("money_type", "must be a number or a decimal string like '12.50'")
    if isinstance(value, int):
        amount = Decimal(value)
    elif isinstance(value, str):
        if _MONEY_TEXT.fullmatch(value) is None:
            raise PydanticCustomError(
                "money_format",
                "must be a decimal string with at most 12 integer digits and 2 decimal places",
            )
        amount = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PydanticCustomError("money_finite", "must be a finite amount")
        if abs(value) >= 1e12:
            raise PydanticCustomError("money_range", "must be below 10**12 in absolute value")
        text = repr(value)
        if "e" in text or len(text.partition(".")[2]) > 2:
            raise PydanticCustomError("money_places", _PLACES_REASON)
        amount = Decimal(text)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise PydanticCustomError("money_finite", "must be a finite amount")
        amount = value
    else:
        raise PydanticCustomError("money_type", "must be a number or a decimal string like '12.50'")
    if abs(amount) >= MONEY_LIMIT:
        raise PydanticCustomError("money_range", "must be below 10**12 in absolute value")
    cents = amount.quantize(CENT)
    if cents != amount:
        raise PydanticCustomError("money_places", "money must have at most 2 decimal places")
    return _ZERO if cents == 0 else cents


def _parse_non_negative_money(value: object) -> Decimal:
    amount = parse_money(value)
    if amount < 0:
        raise PydanticCustomError("money_negative", "must be >= 0")
    return amount


def format_money(amount: Decimal) -> str:
    """Wire form of an amount: a string with exactly two decimals, e.g. ``"12.50"``."""
    return f"{amount:.2f}"


_MONEY_SERIALIZER: Final = PlainSerializer(format_money, return_type=str, when_used="json")
_MONEY_NOTE: Final = "exact CNY: a decimal string like '12.50' or a JSON number, at most 2 decimal places"
#: JSON Schema of the two money types (the 2-decimal rule of JSON numbers is stated, not expressible).
_MONEY_SCHEMA: Final = {
    "description": _MONEY_NOTE,
    "anyOf": [
        {"type": "string", "pattern": f"^{_MONEY_TEXT.pattern}$"},
        {"type": "number", "exclusiveMinimum": -(10**12), "exclusiveMaximum": 10**12},
    ],
}
_NON_NEGATIVE_MONEY_SCHEMA: Final = {
    "description": _MONEY_NOTE + ", >= 0",
    "anyOf": [
        {"type": "string", "pattern": r"^(?:[0-9]{1,12}(?:\.[0-9]{1,2})?|-0{1,12}(?:\.0{1,2})?)$"},
        {"type": "number", "minimum": 0, "exclusiveMaximum": 10**12},
    ],
}

#: Exact CNY amount (Decimal quantized to 0.01); written as a ``"12.50"`` string.
Money = Annotated[
    Decimal,
    PlainValidator(parse_money),
    _MONEY_SERIALIZER,
    WithJsonSchema(_MONEY_SCHEMA, mode="validation"),
]
#: Like :data:`Money`, but >= 0.
NonNegativeMoney = Annotated[
    Decimal,
    PlainValidator(_parse_non_negative_money),
    _MONEY_SERIALIZER,
    WithJsonSchema(_NON_NEGATIVE_MONEY_SCHEMA, mode="validation"),
]
