"""Playback documents shared by the playback unit tests: a valid envelope as the gateway writes it."""

from __future__ import annotations

from typing import Any

__all__ = ["T0", "USER", "event", "payload"]

T0 = 1_717_312_200_000
USER = "sha256:" + "ab" * 32


def payload(**fields: Any) -> dict[str, Any]:
    """A valid playback payload (one partner report); ``fields`` overrides fields."""
    body: dict[str, Any] = {
        "avcc_code": "MA.156.10005.8361/work-1",
        "platform_node": "8361",
        "user_hash": USER,
        "event_type": "play",
        "duration_sec": 1800,
        "revenue_cny": "0.00",
    }
    body.update(fields)
    return body


def event(**fields: Any) -> dict[str, Any]:
    """A valid playback envelope as the gateway writes it; ``fields`` overrides payload fields."""
    return {
        "event_id": "8f14e45f-ceea-467a-9575-3b1b2b7e7a10",
        "timestamp": T0,
        "source": "gateway-svc",
        "payload": payload(**fields),
    }
