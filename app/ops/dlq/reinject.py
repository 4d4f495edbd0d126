"""Re-injection of a dead letter: what it needs from a producer, the headers it sends, its cap.

A re-injected message keeps its key and value (so its event id) and its original headers without
the failure metadata, plus ``avcc-reinjected-by/-at/-count``. Re-injecting the same event for the
same group more than :data:`MAX_REINJECTIONS` times is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol

from app.platform.kafka.producers import Delivery, Headers
from schemas.system import HEADER_PREFIX, header_name

__all__ = [
    "HEADER_REINJECTED_AT",
    "HEADER_REINJECTED_BY",
    "HEADER_REINJECTED_COUNT",
    "MAX_REINJECTIONS",
    "Sender",
    "reinject_headers",
]

#: Re-injections of one event (per consumer group) beyond this are refused.
MAX_REINJECTIONS: Final = 3

HEADER_REINJECTED_BY: Final = "avcc-reinjected-by"
HEADER_REINJECTED_AT: Final = "avcc-reinjected-at"
#: Same header as ``FailureMetadata.reinjected_count``.
HEADER_REINJECTED_COUNT: Final = header_name("reinjected_count")


class Sender(Protocol):
    """What re-injection needs from a producer (:class:`app.platform.kafka.producers.EventProducer` fits)."""

    async def send(
        self,
        topic: Any,
        value: bytes,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> Delivery: ...


def reinject_headers(
    headers: Iterable[tuple[str, bytes]], operator: str, at_ms: int, count: int
) -> list[tuple[str, bytes]]:
    """The original headers without any ``avcc-*`` failure/routing header, plus who/when/how often."""
    kept = [(k, v) for k, v in headers if not k.startswith(HEADER_PREFIX)]
    return [
        *kept,
        (HEADER_REINJECTED_BY, operator.encode()),
        (HEADER_REINJECTED_AT, str(at_ms).encode()),
        (HEADER_REINJECTED_COUNT, str(count).encode()),
    ]
