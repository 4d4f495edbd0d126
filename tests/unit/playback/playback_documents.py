"""Playback documents shared by the playback unit tests: a valid envelope as the gateway writes it."""

from __future__ import annotations

from typing import Any

__all__ = ["T0", "USER", "event"]

T0 = 1_717_312_200_000
USER = "sha256:" + "ab" * 32


def event(**payload: Any) -> dict[str, Any]:
    """A valid playback envelope as the gateway writes it; ``payload`` overrides fields."""
    body: dict[str, Any] = {
        "avcc_code": "MA.156.10005.8361/work-1",
        "platform_node": "8361",
        "user_hash": USER,
        "event_type": "play",
        "duration_sec": 1800,
        "revenue_cny": "0.00",
    }
    body.update(payload)
    return {
        "event_id": "8f14e45f-ceea-467a-9575-3b1b2b7e7a10",
        "timestamp": T0,
        "source": "gateway-svc",
        "payload": body,
    }
