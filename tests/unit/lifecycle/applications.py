"""A valid application (``apply.created``) for the lifecycle tests, with changes on demand."""

from __future__ import annotations

import hashlib
from typing import Any

from schemas.apply import ApplyCreated
from schemas.envelope import Envelope, make_envelope

__all__ = ["GOOD_HASH", "SETTLEMENT_INSTRUCTION", "application_fields", "applied"]

GOOD_HASH = "sha256:" + hashlib.sha256(b"work").hexdigest()

#: A valid settlement instruction (its splits add up to the total).
SETTLEMENT_INSTRUCTION: dict[str, Any] = {
    "instruction_id": "ins-202606-10042",
    "avcc_code": "MA.156.1.1/abc",
    "period_start": 1_780_000_000_000,
    "period_end": 1_780_000_000_000 + 30 * 86_400_000,
    "currency": "CNY",
    "total_cny": "100.30",
    "splits": [
        {"party": "creator", "address": "0x" + "cd" * 20, "amount_cny": "70.10"},
        {"party": "platform", "address": "0x" + "ab" * 20, "amount_cny": "30.20"},
    ],
}


def application_fields(**changes: Any) -> dict[str, Any]:
    """The fields of an O-level application; ``tool`` changes parts of ``ai_tool_info``."""
    base: dict[str, Any] = {
        "request_id": "req_1",
        "avcc_record_id": 10042,
        "content_url": "oss://bucket/works/1.mp4",
        "content_hash": GOOD_HASH,
        "ai_tool_info": {"model_name": "Stable-Diffusion-XL", "model_version": "1.0.2"},
        "priority": 5,
        "title": "Sunrise",
    }
    tool = changes.pop("tool", None)
    if tool:
        base["ai_tool_info"] = {**base["ai_tool_info"], **tool}
    return {**base, **changes}


def applied(**changes: Any) -> Envelope[ApplyCreated]:
    """An ``apply.created`` envelope (fresh event id) of :func:`application_fields`."""
    return make_envelope(ApplyCreated.model_validate(application_fields(**changes)), source="code-svc")
