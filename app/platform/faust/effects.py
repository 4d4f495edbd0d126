"""What a group's event handler asks the runtime to do: events to produce, then state changes.

Kept apart from the runtime (and from faust) so the domain packages can build their outputs
without importing a stream processor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from app.platform.topics import TopicSpec
from schemas.envelope import Envelope

if TYPE_CHECKING:
    from app.platform.faust.tables import Write

__all__ = ["Effects", "Handler", "Outgoing"]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """An event to produce: its topic, the envelope and the record id that keys it."""

    topic: TopicSpec
    envelope: Envelope[BaseModel]
    avcc_record_id: int


@dataclass(slots=True)
class Effects:
    """What a handler wants done: outputs to produce, then table writes to make durable.

    ``writes`` are staged at once (later events of the same batch read them) and applied only
    after every output of the batch is acknowledged; ``apply`` is called after that (effects
    outside the tables, e.g. answering a waiting request). ``duplicate`` marks an event already
    processed (counted, nothing done).
    """

    outputs: list[Outgoing] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    apply: Callable[[], None] | None = None
    duplicate: bool = False


#: A group's handler of one decoded event.
Handler = Callable[[Envelope[Any]], Awaitable[Effects]]
