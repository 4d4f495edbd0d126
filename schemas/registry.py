"""Topic name -> payload model, and the decode/encode entry points for whole events."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeAlias, TypeVar, cast

from pydantic import BaseModel, ValidationError

from app import topics
from app.errors import SchemaViolation
from schemas import codec
from schemas.apply import ApplyCreated
from schemas.chain import ChainTxConfirmed, ChainTxPending
from schemas.decision import HumanDecision
from schemas.envelope import Envelope, envelope_class
from schemas.playback import PlaybackEvent
from schemas.review import ReviewTaskFinished
from schemas.system import AnomalyDetected
from schemas.violations import to_schema_violation

__all__ = [
    "PAYLOAD_MODELS",
    "Payload",
    "decode_as",
    "decode_event",
    "encode_event",
    "encode_payload",
    "payload_model",
    "validate_event",
]

#: Any payload :func:`decode_event` can return.
Payload: TypeAlias = (
    ApplyCreated
    | ReviewTaskFinished
    | ChainTxPending
    | ChainTxConfirmed
    | PlaybackEvent
    | AnomalyDetected
    | HumanDecision
)
_M = TypeVar("_M", bound=BaseModel)

#: The payload contract of every topic whose messages are envelopes. Retry/DLQ topics carry the
#: original message bytes (plus ``FailureMetadata`` headers) and are not listed.
PAYLOAD_MODELS: Final[Mapping[str, type[BaseModel]]] = MappingProxyType(
    {
        topics.APPLY_CREATED.name: ApplyCreated,
        topics.REVIEW_TASK_FINISHED.name: ReviewTaskFinished,
        topics.CHAIN_TX_PENDING.name: ChainTxPending,
        topics.CHAIN_TX_CONFIRMED.name: ChainTxConfirmed,
        topics.PLAYBACK_EVENT.name: PlaybackEvent,
        topics.ANOMALY.name: AnomalyDetected,
        topics.CODE_REVIEW_FINISHED.name: ReviewTaskFinished,
        topics.REVIEW_DECISIONS.name: HumanDecision,
    }
)
_ENVELOPES: Final[Mapping[str, type[Envelope[BaseModel]]]] = MappingProxyType(
    {topic: envelope_class(model) for topic, model in PAYLOAD_MODELS.items()}
)


def payload_model(topic: str) -> type[BaseModel]:
    """The payload model of ``topic``; ``SchemaViolation`` (field ``topic``) if it has none."""
    try:
        return PAYLOAD_MODELS[topic]
    except KeyError:
        raise _unknown_topic(topic) from None


def _unknown_topic(topic: str) -> SchemaViolation:
    return SchemaViolation(f"topic: unknown topic {topic[:200]!r}", ("topic",))


def _validate(model: type[Envelope[_M]], raw: bytes | bytearray | memoryview | str) -> Envelope[_M]:
    data = codec.loads(raw)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise to_schema_violation(exc) from exc


def decode_event(topic: str, raw: bytes | bytearray | memoryview | str) -> Envelope[Payload]:
    """Decode and validate one message of ``topic``.

    Raises ``UndecodableMessage`` (not UTF-8 JSON / not an object) or ``SchemaViolation`` (unknown
    topic, or contract broken: ``fields`` holds dotted paths such as ``payload.priority``).
    """
    model = _ENVELOPES.get(topic)
    if model is None:
        raise _unknown_topic(topic)
    return cast("Envelope[Payload]", _validate(model, raw))


#: Alias of :func:`decode_event` (used by ``avcc validate``).
validate_event = decode_event


def decode_as(model: type[_M], raw: bytes | bytearray | memoryview | str) -> Envelope[_M]:
    """Like :func:`decode_event` with the payload model given, for a statically typed result."""
    return _validate(envelope_class(model), raw)


def encode_event(envelope: Envelope[BaseModel]) -> bytes:
    """Wire bytes of an envelope: compact JSON, UUID and money as strings, ``None`` fields omitted."""
    return codec.dumps(envelope.model_dump(mode="json", exclude_none=True))


def encode_payload(payload: BaseModel) -> bytes:
    """Wire bytes of a bare payload (same conventions as :func:`encode_event`)."""
    return codec.dumps(payload.model_dump(mode="json", exclude_none=True))
