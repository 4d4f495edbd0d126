"""Record lifecycle dedup: event ids are remembered as long as the record's inputs keep events."""

from __future__ import annotations

from app.lifecycle.code.records import SEEN, apply_created, is_duplicate
from app.platform.topics import DAY_MS
from tests.unit.lifecycle.applications import applied


def test_ids_kept_as_long_as_chain_receipts_are() -> None:
    assert SEEN.retention_ms == 30 * DAY_MS
    first, second = applied(), applied()
    state = apply_created(None, first, 0, "1", "1")
    assert is_duplicate(state, first) and not is_duplicate(state, second)
    later = apply_created(state, second, 30 * DAY_MS, "1", "1")
    assert not is_duplicate(later, first) and is_duplicate(later, second)
