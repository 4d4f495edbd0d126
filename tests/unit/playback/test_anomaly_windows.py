"""Event-time windows of the anomaly detector, driven directly with decoded events (no broker)."""

from __future__ import annotations

import uuid
from typing import Any

from app.playback.anomaly.settings import AnomalyRuleSettings
from app.playback.anomaly.windows import PartitionState, Windows

W = 60_000
T0 = 1_717_312_200_000 // W * W  # a window start
NOW = T0 + 3_600_000  # the wall clock: an hour after the first window
CODE = "MA.156.10005.8361/AV2026000001"
USER = "sha256:" + "ab" * 32


def envelope(ts: int, *, event_id: str | None = None, code: str = CODE, user: str = USER) -> dict[str, Any]:
    """A decoded playback envelope as the gateway writes it."""
    return {
        "event_id": event_id or str(uuid.uuid4()),
        "timestamp": ts,
        "source": "gateway-svc",
        "payload": {
            "avcc_code": code,
            "platform_node": "8361",
            "user_hash": user,
            "event_type": "play",
            "duration_sec": 60,
            "revenue_cny": "0.00",
        },
    }


def events(closed: dict[int, Any]) -> dict[int, int]:
    """Window start -> event count of a close's windows."""
    return {start: agg.events for start, agg in closed.items()}


def windows(*partitions: int, lateness_windows: int = 1, replay_min_count: int = 30) -> Windows:
    """Windows owning fresh states of ``partitions``."""
    owned = Windows(
        AnomalyRuleSettings(window_s=W // 1000, replay_min_count=replay_min_count),
        lateness_windows=lateness_windows,
        max_future_ms=600_000,
    )
    owned.adopt({p: PartitionState(p) for p in partitions})
    return owned


def test_events_in_order_fill_their_windows_and_advance_offset_and_watermark() -> None:
    owned = windows(0)
    events = [(0, 10 + i, envelope(T0 + i * 20_000)) for i in range(6)]  # 3 per window
    tally = owned.count(events, NOW)
    state = owned.states[0]
    assert tally.counted == 6
    assert (tally.late, tally.undecodable, tally.future, tally.duplicates) == (0, 0, 0, 0)
    assert {start: agg.events for start, agg in state.windows.items()} == {T0: 3, T0 + W: 3}
    assert state.offset == 16  # the next offset to consume
    assert state.watermark == T0 + 100_000 and state.dirty
    assert owned.watermark() == T0 + 100_000


def test_a_window_closes_only_once_the_watermark_passes_its_end_plus_the_lateness() -> None:
    owned = windows(0, lateness_windows=1)
    owned.count([(0, 0, envelope(T0 + 5))], NOW)
    owned.count([(0, 1, envelope(T0 + 2 * W - 1))], NOW)  # end of window 1: window 0 within lateness
    progress = owned.close(owned.watermark())  # only the progress: nothing before T0
    assert [(c.partition, c.since, c.until, c.windows) for c in progress] == [(0, 0, T0, {})]
    owned.count([(0, 2, envelope(T0 + 2 * W))], NOW)  # window 2 begins: window 0 is 1 window late
    closed = owned.close(owned.watermark())
    assert [(c.partition, c.since, c.until, events(c.windows)) for c in closed] == [(0, T0, T0 + W, {T0: 1})]
    assert owned.close(owned.watermark()) == []  # nothing new to report
    assert sorted(owned.states[0].windows) == [T0 + W, T0 + 2 * W]
    assert owned.states[0].closed_until == T0 + W


def test_late_events_count_within_the_lateness_and_are_dropped_after_it() -> None:
    owned = windows(0, lateness_windows=1)
    owned.count([(0, 0, envelope(T0 + 5)), (0, 1, envelope(T0 + W + 5))], NOW)
    within = owned.count([(0, 2, envelope(T0 + 10))], NOW)  # window 0 still open
    assert (within.counted, within.late) == (1, 0)
    assert owned.states[0].windows[T0].events == 2
    owned.count([(0, 3, envelope(T0 + 2 * W + 5))], NOW)
    assert [events(c.windows) for c in owned.close(owned.watermark())] == [{T0: 2}]
    after = owned.count([(0, 4, envelope(T0 + 20))], NOW)  # window 0 closed: late
    assert (after.counted, after.late) == (0, 1)
    assert T0 not in owned.states[0].windows  # a late event never re-opens its window
    assert owned.states[0].late == 1 and owned.states[0].offset == 5


def test_the_watermark_is_the_slowest_partition_with_data_to_read() -> None:
    owned = windows(0, 1, 2)
    owned.count([(0, 0, envelope(T0 + 5 * W)), (1, 0, envelope(T0 + 2 * W))], NOW)
    assert owned.watermark() == -1  # partition 2 has data to read but no event yet
    owned.reached_end(2)
    assert owned.watermark() == T0 + 2 * W  # the minimum over partitions 0 and 1
    owned.reached_end(1)
    assert owned.watermark() == T0 + 5 * W  # partition 0 only
    owned.reached_end(0)
    assert owned.watermark() == T0 + 5 * W  # all at their end: the maximum
    owned.count([(1, 1, envelope(T0 + 3 * W))], NOW)  # partition 1 has data again
    assert owned.watermark() == T0 + 3 * W


def test_closing_reports_every_owned_partition_even_without_events() -> None:
    """Stage 2 needs each source partition's progress, so idle partitions report it too."""
    owned = windows(0, 1, 2, lateness_windows=0)
    owned.count([(0, i, envelope(T0 + i)) for i in range(3)], NOW)
    owned.count([(1, 0, envelope(T0 + 100)), (1, 1, envelope(T0 + W))], NOW)
    owned.count([(0, 3, envelope(T0 + W))], NOW)
    owned.reached_end(2)
    closed = owned.close(owned.watermark())
    assert [(c.partition, c.since, c.until, events(c.windows)) for c in closed] == [
        (0, 0, T0 + W, {T0: 3}),
        (1, 0, T0 + W, {T0: 1}),
        (2, 0, T0 + W, {}),
    ]
    assert all(T0 not in s.windows and T0 not in s.seen for s in owned.states.values())
    assert all(s.closed_until == T0 + W for s in owned.states.values())
    assert owned.open_windows() == 2


def test_name_based_duplicates_count_once_random_ids_always_count() -> None:
    owned = windows(0, 1)
    retried = str(uuid.uuid5(uuid.NAMESPACE_URL, "8361:order-1"))
    random_id = str(uuid.uuid4())
    tally = owned.count(
        [
            (0, 0, envelope(T0 + 1, event_id=retried)),
            (0, 1, envelope(T0 + 2, event_id=retried)),  # a partner retry: same uuid5
            (1, 0, envelope(T0 + W + 3, event_id=retried)),  # even in another partition's window
            (0, 2, envelope(T0 + 4, event_id=random_id)),
            (0, 3, envelope(T0 + 5, event_id=random_id)),  # uuid4: not an idempotency key
        ],
        NOW,
    )
    assert (tally.counted, tally.duplicates) == (4, 1)
    assert owned.states[0].windows[T0].events == 3
    assert owned.states[0].seen == {T0: {retried}}


def test_future_undecodable_and_unowned_events_are_skipped_but_advance_the_offset() -> None:
    owned = windows(0)
    tally = owned.count(
        [
            (0, 0, envelope(NOW + 600_001)),  # beyond max_future_ms
            (0, 1, None),  # not JSON
            (0, 2, {"timestamp": T0}),  # not an envelope
            (0, 3, envelope(T0 + 1) | {"timestamp": float(T0)}),  # timestamp must be an integer
            (7, 0, envelope(T0 + 1)),  # a partition this detector does not own
        ],
        NOW,
    )
    assert (tally.counted, tally.future, tally.undecodable) == (0, 1, 3)
    assert owned.states[0].offset == 4 and owned.states[0].windows == {}
    assert 7 not in owned.states


def test_forgotten_partitions_no_longer_hold_the_watermark() -> None:
    owned = windows(0, 1)
    owned.count([(0, 0, envelope(T0 + 2 * W)), (1, 0, envelope(T0))], NOW)
    owned.forget([1])
    assert list(owned.states) == [0] and owned.watermark() == T0 + 2 * W
