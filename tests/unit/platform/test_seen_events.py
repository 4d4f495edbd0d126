"""The one seen-ids rule: ids are kept as long as the input topics keep their events."""

from __future__ import annotations

from dataclasses import replace

from app.platform.faust.dedup import SeenEvents
from app.platform.topics import APPLY_CREATED, CHAIN_TX_CONFIRMED, DAY_MS, DLQ, RETRY


def test_retention_is_the_longest_of_the_inputs_and_the_retry_topic() -> None:
    assert SeenEvents.for_inputs(APPLY_CREATED).retention_ms == 7 * DAY_MS
    assert SeenEvents.for_inputs(APPLY_CREATED, CHAIN_TX_CONFIRMED).retention_ms == 30 * DAY_MS
    short = replace(APPLY_CREATED, retention_ms=DAY_MS)
    assert SeenEvents.for_inputs(short).retention_ms == RETRY.retention_ms
    assert SeenEvents.for_inputs(DLQ).retention_ms is None


def test_remember_prunes_ids_past_retention_only() -> None:
    rule = SeenEvents(retention_ms=1000)
    seen = rule.remember({}, "a", 0)
    seen = rule.remember(seen, "b", 500)
    assert SeenEvents.contains(seen, "a") and SeenEvents.contains(seen, "b")
    later = rule.remember(seen, "c", 1000)
    assert later == {"b": 500, "c": 1000}
    assert not SeenEvents.contains(later, "a")
    assert seen == {"a": 0, "b": 500}  # the input is never mutated


def test_forever_keeps_everything() -> None:
    rule = SeenEvents(retention_ms=None)
    assert rule.remember({"old": 0}, "new", 10**15) == {"old": 0, "new": 10**15}
