"""The envelope every Kafka event travels in, generic over its payload model."""

from __future__ import annotations

import time
import uuid
from functools import cache
from typing import Any, Generic, TypeVar, cast

from pydantic import BaseModel, SerializeAsAny, ValidationError

from schemas import codec
from schemas.types import ContractModel, EpochMillis, EventId, SourceName
from schemas.violations import to_schema_violation

__all__ = [
    "Envelope",
    "PayloadT",
    "decode_as",
    "encode_event",
    "encode_payload",
    "envelope_class",
    "make_envelope",
    "validate_envelope",
]

#: The payload model of an envelope (covariant: ``Envelope[ApplyCreated]`` is an
#: ``Envelope[BaseModel]``).
PayloadT = TypeVar("PayloadT", bound=BaseModel, covariant=True)
_M = TypeVar("_M", bound=BaseModel)


class Envelope(ContractModel, Generic[PayloadT]):
    """``{"event_id", "timestamp", "source", "payload"}`` (seed 9.2); use ``Envelope[Model]``."""

    #: Idempotency key of the event (canonical lowercase UUID string on the wire).
    event_id: EventId
    #: Production time, epoch milliseconds.
    timestamp: EpochMillis
    #: Producing service, e.g. ``code-svc``.
    source: SourceName
    payload: SerializeAsAny[PayloadT]


@cache
def envelope_class(model: type[_M]) -> type[Envelope[_M]]:
    """The (cached) parametrized envelope class ``Envelope[model]``."""
    return Envelope[model]  # type: ignore[valid-type]


def make_envelope(
    payload: _M,
    *,
    source: str,
    event_id: uuid.UUID | None = None,
    timestamp_ms: int | None = None,
) -> Envelope[_M]:
    """Wrap ``payload`` in a new envelope (fresh uuid4 and the current time by default).

    Raises ``SchemaViolation`` (e.g. field ``source``) when an envelope field breaks the contract.
    """
    fields: dict[str, Any] = {
        "event_id": event_id if event_id is not None else uuid.uuid4(),
        "timestamp": timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000,
        "source": source,
        "payload": payload,
    }
    try:
        return cast("Envelope[_M]", envelope_class(type(payload))(**fields))
    except ValidationError as exc:
        raise to_schema_violation(exc) from exc


def validate_envelope(model: type[Envelope[_M]], raw: bytes | bytearray | memoryview | str) -> Envelope[_M]:
    """Decode ``raw`` as one envelope of ``model``; ``UndecodableMessage`` / ``SchemaViolation``."""
    data = codec.loads(raw)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise to_schema_violation(exc) from exc


def decode_as(model: type[_M], raw: bytes | bytearray | memoryview | str) -> Envelope[_M]:
    """Decode one message whose payload model is known, for a statically typed result."""
    return validate_envelope(envelope_class(model), raw)


def encode_event(envelope: Envelope[BaseModel]) -> bytes:
    """Wire bytes of an envelope: compact JSON, UUID and money as strings, ``None`` fields omitted."""
    return codec.dumps(envelope.model_dump(mode="json", exclude_none=True))


def encode_payload(payload: BaseModel) -> bytes:
    """Wire bytes of a bare payload (same conventions as :func:`encode_event`)."""
    return codec.dumps(payload.model_dump(mode="json", exclude_none=True))
