"""Topic name -> payload model, and decoding a message of a named topic (the plan meets the contracts)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeAlias, TypeVar, cast

from pydantic import BaseModel

from app.platform import topics
from schemas.apply import ApplyCreated
from schemas.chain import ChainTxConfirmed, ChainTxPending
from schemas.decision import HumanDecision
from schemas.envelope import Envelope, envelope_class, validate_envelope
from schemas.errors import SchemaViolation
from schemas.playback import PlaybackEvent
from schemas.review import ReviewTaskFinished
from schemas.system import AnomalyDetected

__all__ = [
    "PAYLOAD_MODELS",
    "Payload",
    "decode_event",
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


def decode_event(topic: str, raw: bytes | bytearray | memoryview | str) -> Envelope[Payload]:
    """Decode and validate one message of ``topic``.

    Raises ``UndecodableMessage`` (not UTF-8 JSON / not an object) or ``SchemaViolation`` (unknown
    topic, or contract broken: ``fields`` holds dotted paths such as ``payload.priority``).
    """
    model = _ENVELOPES.get(topic)
    if model is None:
        raise _unknown_topic(topic)
    return cast("Envelope[Payload]", validate_envelope(model, raw))


#: Alias of :func:`decode_event` (used by ``avcc validate``).
validate_event = decode_event
