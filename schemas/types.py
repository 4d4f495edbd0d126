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
    BeforeValidator,
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
    "EXACT_FLOAT_INT",
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
    "WHITESPACE_CLASS",
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
    "WholeNumber",
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
#: Unicode ``White_Space``, spelled out: ``\s`` differs between the regex engines that read these
#: patterns (Python's ``re`` adds U+001C-U+001F, ECMA-262 drops U+0085 and adds U+FEFF), so the
#: models and the published schemas name the 25 characters themselves.
WHITESPACE_CLASS: Final = r"\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_NOT_BLANK_PATTERN: Final = f"[^{WHITESPACE_CLASS}]"
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
    rf"(?:s3|oss|https?)://[^{WHITESPACE_CLASS}/?#@\x00-\x1f\x7f]+/[^{WHITESPACE_CLASS}\x00-\x1f\x7f]+"
    rf"|ipfs://[^{WHITESPACE_CLASS}/?#@\x00-\x1f\x7f]+(?:/[^{WHITESPACE_CLASS}\x00-\x1f\x7f]*)?"
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

#: Largest integer every JSON number with a fraction or an exponent still states exactly.
EXACT_FLOAT_INT: Final = 2**53


def _whole_number(value: object) -> object:
    """A JSON number written with a zero fraction or an exponent (``5.0``, ``1e3``) as the integer
    it is: JSON Schema counts it as an integer, so the models do too. Beyond 2**53 such a number
    no longer states its digits exactly and stays refused (write the integer's digits)."""
    if type(value) is float and value.is_integer() and abs(value) <= EXACT_FLOAT_INT:
        return int(value)
    return value


#: Marks an ``int`` field as a JSON integer or a JSON number with a zero fraction up to 2**53;
#: put it after the field's bounds (``Annotated[int, Field(ge=0), WholeNumber]``), so the bounds
#: stay in the published schema.
WholeNumber: Final = BeforeValidator(_whole_number)
#: A database id: 1 .. 2**63-1 (a JSON integer on the wire).
RecordId = Annotated[int, Field(ge=1, le=_INT63_MAX), WholeNumber]
BlockHeight = Annotated[int, Field(ge=0, le=_INT63_MAX), WholeNumber]
#: Epoch milliseconds between 2000-01-01 and 2100-01-01 (UTC).
EpochMillis = Annotated[int, Field(ge=MIN_EPOCH_MS, lt=MAX_EPOCH_MS), WholeNumber]
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
_WHOLE_NUMBER_REASON: Final = (
    "a JSON number amount must be whole (12 or 12.0): give cents as a decimal string like '12.50'"
)


def parse_money(value: object) -> Decimal:
    """Exact amount from an int, a ``"12.50"`` string, a whole float (``12.0``) or a Decimal.

    A JSON number is a binary float: ``0.07`` is not 7 cents but the double nearest to it, and no
    JSON Schema validator can tell how many decimals it was written with (``multipleOf: 0.01``
    refuses 0.07, 0.14, 1.1 and about one amount in six). So amounts with cents travel as decimal
    strings, and a JSON number must be whole: a rule the published schemas state (``integer``),
    so partners' validators and the pipeline agree. Raises ``PydanticCustomError`` (inside
    validation it becomes a field error).
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
        if not value.is_integer():
            raise PydanticCustomError("money_places", _WHOLE_NUMBER_REASON)
        amount = Decimal(int(value))
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
_MONEY_NOTE: Final = (
    "exact CNY: a decimal string with at most 2 decimal places like '12.50', or a whole JSON number "
    "(12 or 12.0; a JSON number cannot carry cents exactly)"
)
#: JSON Schema of the two money types: every rule of :func:`parse_money` stated.
_MONEY_SCHEMA: Final = {
    "description": _MONEY_NOTE,
    "anyOf": [
        {"type": "string", "pattern": f"^{_MONEY_TEXT.pattern}$"},
        {"type": "integer", "exclusiveMinimum": -(10**12), "exclusiveMaximum": 10**12},
    ],
}
_NON_NEGATIVE_MONEY_SCHEMA: Final = {
    "description": _MONEY_NOTE + ", >= 0",
    "anyOf": [
        {"type": "string", "pattern": r"^(?:[0-9]{1,12}(?:\.[0-9]{1,2})?|-0{1,12}(?:\.0{1,2})?)$"},
        {"type": "integer", "minimum": 0, "exclusiveMaximum": 10**12},
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
