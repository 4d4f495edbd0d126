"""Record lifecycle dedup: event ids are remembered as long as the record's inputs keep events."""

from __future__ import annotations

import hashlib
from typing import Any

from app.lifecycle.code.records import SEEN, apply_created, is_duplicate
from app.platform.topics import DAY_MS
from schemas.apply import ApplyCreated
from schemas.envelope import Envelope, make_envelope

HASH = "sha256:" + hashlib.sha256(b"work").hexdigest()


def applied() -> Envelope[ApplyCreated]:
    fields: dict[str, Any] = {
        "request_id": "req_1",
        "avcc_record_id": 10042,
        "content_url": "oss://bucket/works/1.mp4",
        "content_hash": HASH,
        "ai_tool_info": {"model_name": "Stable-Diffusion-XL", "model_version": "1.0.2"},
        "priority": 5,
        "title": "Sunrise",
    }
    return make_envelope(ApplyCreated.model_validate(fields), source="code-svc")


def test_ids_kept_as_long_as_chain_receipts_are() -> None:
    assert SEEN.retention_ms == 30 * DAY_MS
    first, second = applied(), applied()
    state = apply_created(None, first, 0, "1", "1")
    assert is_duplicate(state, first) and not is_duplicate(state, second)
    later = apply_created(state, second, 30 * DAY_MS, "1", "1")
    assert not is_duplicate(later, first) and is_duplicate(later, second)
