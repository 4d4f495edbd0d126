"""Synthetic playback traffic (deterministic per seed) and applications for the benches and tests."""

from __future__ import annotations

import hashlib
import random
import uuid
from typing import Any

import orjson

__all__ = ["code", "envelope", "o_level_application", "payload", "user_hash"]

SOURCE = "gateway-svc"


def user_hash(index: int) -> str:
    """A valid ``sha256:<64 hex>`` user hash."""
    return "sha256:" + hashlib.sha256(f"user-{index}".encode()).hexdigest()


def code(index: int) -> str:
    """A valid AVCC code."""
    return f"MA.156.10005.8361/AV2026{index:06d}"


def payload(
    rng: random.Random,
    *,
    code_index: int,
    node: str,
    user: str,
    event_type: str | None = None,
) -> dict[str, Any]:
    """One valid playback payload."""
    kind = event_type or rng.choices(("play", "complete", "purchase"), (80, 17, 3))[0]
    return {
        "avcc_code": code(code_index),
        "platform_node": node,
        "user_hash": user,
        "event_type": kind,
        "duration_sec": rng.randint(1, 3600) if kind != "purchase" else 0,
        "revenue_cny": f"{rng.randint(1, 5000) / 100:.2f}" if kind == "purchase" else "0.00",
    }


def envelope(item: dict[str, Any], timestamp_ms: int, event_id: str | None = None) -> bytes:
    """The envelope bytes the gateway would produce for ``item``."""
    return orjson.dumps(
        {
            "event_id": event_id or str(uuid.uuid4()),
            "timestamp": timestamp_ms,
            "source": SOURCE,
            "payload": item,
        }
    )


def o_level_application() -> dict[str, Any]:
    """A fresh O-level work's application (auto-approved, so its code is issued without a person)."""
    return {
        "request_id": f"req_{uuid.uuid4().hex[:16]}",
        "content_url": "s3://aigc-hub-storage/works/raw/bench.mp4",
        "content_hash": "sha256:" + hashlib.sha256(uuid.uuid4().bytes).hexdigest(),
        "ai_tool_info": {"model_name": "Stable-Diffusion-XL", "model_version": "v1.0"},
        "priority": 9,
        "title": "bench work",
        "applicant_id": "bench",
    }
