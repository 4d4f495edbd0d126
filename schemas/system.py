"""Failure metadata carried by retry/DLQ messages, and the playback anomaly payload."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final

from pydantic import (
    Field,
    PlainValidator,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from schemas.errors import SchemaViolation
from schemas.types import (
    AnomalyRule,
    ContractModel,
    EpochMillis,
    MaCode,
    NonBlankStr,
    PlatformNode,
    Sha256Ref,
    Token,
)
from schemas.violations import to_schema_violation

__all__ = [
    "HEADER_PREFIX",
    "MAX_ERROR_MESSAGE",
    "MAX_STACKTRACE",
    "AnomalyDetected",
    "FailureMetadata",
    "header_name",
]

#: Every failure-metadata Kafka header starts with this.
HEADER_PREFIX: Final = "avcc-"
#: Longer error messages / stack traces are cut to this many characters (suffix included).
MAX_ERROR_MESSAGE: Final = 2048
MAX_STACKTRACE: Final = 16384
_TRUNCATED: Final = "...[truncated]"


def _truncate(value: object, limit: int) -> object:
    if isinstance(value, str) and len(value) > limit:
        return value[: limit - len(_TRUNCATED)] + _TRUNCATED
    return value


def header_name(field: str) -> str:
    """Kafka header of a :class:`FailureMetadata` field: ``original_topic`` -> ``avcc-original-topic``."""
    return HEADER_PREFIX + field.replace("_", "-")


_Count = Annotated[int, Field(ge=0)]


class FailureMetadata(ContractModel):
    """Where a failed message came from and why it failed; rides on retry and DLQ messages.

    As Kafka headers (:meth:`to_headers` / :meth:`from_headers`) or as a JSON document
    (``schemas.codec.dumps(meta)`` / ``FailureMetadata.model_validate(codec.loads(raw))``).
    Long ``error_message`` / ``stacktrace`` values are truncated, never refused.
    """

    original_topic: NonBlankStr
    original_partition: _Count
    original_offset: _Count
    #: Kafka record timestamp (epoch ms); -1 when the record had none.
    original_timestamp_ms: Annotated[int, Field(ge=-1)]
    #: The record key decoded as UTF-8 (``None``: the record had no key).
    original_key: str | None = None
    consumer_group: NonBlankStr
    #: 1 for the first failure, incremented by every retry.
    attempt: Annotated[int, Field(ge=1)]
    first_failure_ms: EpochMillis
    last_failure_ms: EpochMillis
    #: Qualified exception class name, e.g. ``app.platform.errors.DependencyTimeout``.
    error_class: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    error_message: str
    #: Retry topic only: do not redeliver before this time (epoch ms).
    not_before_ms: EpochMillis | None = None
    stacktrace: str | None = None
    event_id: str | None = None
    #: How many times an operator re-injected the message from the DLQ.
    reinjected_count: _Count = 0

    @field_validator("error_message", mode="before")
    @classmethod
    def _cut_message(cls, value: object) -> object:
        return _truncate(value, MAX_ERROR_MESSAGE)

    @field_validator("stacktrace", mode="before")
    @classmethod
    def _cut_stacktrace(cls, value: object) -> object:
        return _truncate(value, MAX_STACKTRACE)

    @field_validator("last_failure_ms")
    @classmethod
    def _last_after_first(cls, value: int, info: ValidationInfo) -> int:
        first = info.data.get("first_failure_ms")
        if isinstance(first, int) and value < first:
            raise PydanticCustomError("failure_order", "must be >= first_failure_ms")
        return value

    def to_headers(self) -> list[tuple[str, bytes]]:
        """``avcc-*`` headers (UTF-8 text; integers in decimal); ``None`` fields are omitted."""
        headers: list[tuple[str, bytes]] = []
        for field, value in self:
            if value is not None:
                headers.append((header_name(field), str(value).encode()))
        return headers

    @classmethod
    def from_headers(
        cls, headers: Iterable[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None]
    ) -> FailureMetadata:
        """Parse the ``avcc-*`` headers (others are ignored).

        Raises ``SchemaViolation`` naming the headers (``headers.avcc-attempt``) on bad values.
        """
        items = headers.items() if isinstance(headers, Mapping) else headers
        data: dict[str, Any] = {}
        bad: list[str] = []
        for name, raw in items:
            field = _FIELD_FOR_HEADER.get(name.lower())
            if field is None or raw is None:
                continue
            try:
                text = raw if isinstance(raw, str) else bytes(raw).decode()
            except UnicodeDecodeError:
                bad.append(name)
                continue
            if field in _INT_FIELDS:
                data[field] = int(text) if _is_decimal(text) else text
            else:
                data[field] = text
        if bad:
            paths = [f"headers.{name}" for name in bad]
            raise SchemaViolation("; ".join(f"{p}: must be UTF-8 text" for p in paths), paths)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise to_schema_violation(exc, prefix="headers", rename=header_name) from exc


def _is_decimal(text: str) -> bool:
    digits = text[1:] if text.startswith("-") else text
    return digits.isascii() and digits.isdigit() and len(digits) <= 19


_FIELD_FOR_HEADER: Final[dict[str, str]] = {header_name(f): f for f in FailureMetadata.model_fields}
_INT_FIELDS: Final = frozenset(
    {
        "original_partition",
        "original_offset",
        "original_timestamp_ms",
        "attempt",
        "first_failure_ms",
        "last_failure_ms",
        "not_before_ms",
        "reinjected_count",
    }
)


def _parse_evidence_value(value: object) -> str | int | float:
    if isinstance(value, bool):
        raise PydanticCustomError("evidence_value", "must be a string, an integer or a finite number")
    if isinstance(value, str | int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise PydanticCustomError("evidence_value", "must be a string, an integer or a finite number")


_EvidenceValue = Annotated[
    str | int | float, PlainValidator(_parse_evidence_value, json_schema_input_type=str | int | float)
]
_Measure = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class AnomalyDetected(ContractModel):
    """An anomaly found on the playback stream (payload of ``topic.playback.anomaly``)."""

    anomaly_id: Token
    rule: AnomalyRule
    avcc_code: MaCode | None = None
    platform_node: PlatformNode | None = None
    user_hash: Sha256Ref | None = None
    window_start_ms: EpochMillis
    window_end_ms: EpochMillis
    #: The measured value (count, seconds, CNY, ratio: depends on ``rule``).
    observed: _Measure
    baseline: _Measure | None = None
    threshold: Annotated[float, Field(allow_inf_nan=False)]
    #: Small flat facts backing the finding (ids, counts, ratios).
    evidence: dict[str, _EvidenceValue] = Field(default_factory=dict, max_length=64)

    @field_validator("window_end_ms")
    @classmethod
    def _end_after_start(cls, value: int, info: ValidationInfo) -> int:
        start = info.data.get("window_start_ms")
        if isinstance(start, int) and value < start:
            raise PydanticCustomError("window_order", "must be >= window_start_ms")
        return value
