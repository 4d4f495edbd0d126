"""Payload of ``topic.playback.event``: one partner playback/purchase report (seed 9.2.4)."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field

from schemas.types import (
    ContractModel,
    MaCode,
    NonNegativeMoney,
    PlatformNode,
    PlaybackEventType,
    Sha256Ref,
    Token,
    WholeNumber,
)

__all__ = ["MAX_DURATION_SEC", "PlaybackEvent"]

#: One week: no single playback lasts longer.
MAX_DURATION_SEC: Final = 7 * 24 * 3600


class PlaybackEvent(ContractModel):
    """A play / complete / purchase reported by a platform node (gateway-svc -> sinks)."""

    avcc_code: MaCode
    platform_node: PlatformNode
    #: sha256 of the platform's user id (never the id itself).
    user_hash: Sha256Ref
    event_type: PlaybackEventType
    duration_sec: Annotated[int, Field(ge=0, le=MAX_DURATION_SEC), WholeNumber]
    #: Exact CNY, >= 0; written as a ``"0.00"`` string.
    revenue_cny: NonNegativeMoney
    #: The platform's own id of the event, when it supplies one.
    idempotency_id: Token | None = None
