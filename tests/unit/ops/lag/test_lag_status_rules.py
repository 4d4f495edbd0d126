"""The pure lag evaluation functions: windows, slope, Burrow-style partition status and rule firing."""

from __future__ import annotations

import pytest

from app.ops.lag.evaluation import (
    Sample,
    evaluate_rule,
    least_squares_slope,
    partition_status,
    samples_within,
)
from app.platform.lag.snapshot import GroupState
from tests.unit.ops.lag.lag_samples import GROUP, rule

LIVE = GroupState(GROUP, "STABLE", 2)
EMPTY = GroupState(GROUP, "EMPTY", 0)
UNKNOWN = GroupState(GROUP, "UNKNOWN")


def history(*points: tuple[float, int | None, int]) -> list[Sample]:
    """Samples from ``(at, committed, lag)`` triples, oldest first."""
    return [Sample(at, committed, lag) for at, committed, lag in points]


def test_window_keeps_the_anchor_before_its_start() -> None:
    samples = history((0, 1, 5), (10, 2, 5), (20, 3, 5), (30, 4, 5))
    inside, covered = samples_within(samples, now=30, span=15)
    assert covered
    assert [s.at for s in inside] == [10, 20, 30]  # 10 is the anchor (at or before 30 - 15)


def test_window_without_an_anchor_is_not_covered() -> None:
    inside, covered = samples_within(history((20, 1, 5), (30, 2, 5)), now=30, span=15)
    assert not covered and [s.at for s in inside] == [20, 30]


def test_slope_is_the_least_squares_fit() -> None:
    assert least_squares_slope([(0, 0), (1, 2), (2, 4)]) == pytest.approx(2.0)
    assert least_squares_slope([(0, 10), (1, 5), (2, 0)]) == pytest.approx(-5.0)
    assert least_squares_slope([(0, 3)]) == 0.0  # one point: no trend
    assert least_squares_slope([(5, 1), (5, 9)]) == 0.0  # no time spread


def test_status_without_samples_or_lag_is_ok() -> None:
    assert partition_status([], 0, 60, LIVE) == ("OK", "no data")
    assert partition_status(history((0, 5, 0)), 0, 60, LIVE)[0] == "OK"


def test_status_is_stop_when_the_group_has_no_members_whatever_the_history() -> None:
    status, reason = partition_status(history((0, 5, 7)), 0, 60, EMPTY)
    assert status == "STOP" and "no members" in reason


def test_status_is_ok_until_the_history_covers_the_window() -> None:
    status, reason = partition_status(history((30, 5, 7), (60, 5, 7)), 60, 60, LIVE)
    assert status == "OK" and "shorter than" in reason


def test_frozen_commit_is_stall_with_live_members_and_stop_otherwise() -> None:
    frozen = history((0, 5, 7), (30, 5, 8), (60, 5, 9))
    assert partition_status(frozen, 60, 60, LIVE)[0] == "STALL"
    assert partition_status(frozen, 60, 60, UNKNOWN)[0] == "STOP"
    assert partition_status(frozen, 60, 60, None)[0] == "STOP"


def test_never_committed_for_the_window_is_stop_unless_members_are_alive() -> None:
    never = history((0, None, 7), (60, None, 9))
    status, reason = partition_status(never, 60, 60, UNKNOWN)
    assert status == "STOP" and "nothing committed" in reason
    assert partition_status(never, 60, 60, LIVE)[0] == "STALL"


def test_moving_consumer_is_warn_only_when_lag_grows_at_every_sample() -> None:
    growing = history((0, 1, 5), (30, 2, 6), (60, 3, 8))
    assert partition_status(growing, 60, 60, LIVE)[0] == "WARN"
    flat_then_up = history((0, 1, 5), (30, 2, 5), (60, 3, 8))
    assert partition_status(flat_then_up, 60, 60, LIVE)[0] == "WARN"  # never shrinks, ends higher
    dipping = history((0, 1, 5), (30, 2, 4), (60, 3, 8))
    assert partition_status(dipping, 60, 60, LIVE)[0] == "OK"
    two_samples = history((0, 1, 5), (60, 3, 8))
    assert partition_status(two_samples, 60, 60, LIVE)[0] == "OK"  # too few samples for a trend


def test_rule_fires_above_max_lag_strictly() -> None:
    r = rule(not_shrinking_s=None)
    assert not evaluate_rule(r, GROUP, [(0, 1000)], 0, True).firing
    state = evaluate_rule(r, GROUP, [(0, 1001)], 0, True)
    assert state.firing and state.lag == 1001 and "> 1000" in state.reason


def test_rule_does_not_fire_when_its_topic_is_absent() -> None:
    state = evaluate_rule(rule(), GROUP, [(0, 5000)], 0, False)
    assert not state.firing and state.reason == "topic not found"
    assert not evaluate_rule(rule(), GROUP, [], 0, True).firing


def test_not_shrinking_rule_needs_the_whole_window_above_its_minimum() -> None:
    r = rule(max_lag=None, not_shrinking_s=60.0, not_shrinking_min_lag=10)
    steady = [(0.0, 20), (30.0, 20), (60.0, 20)]
    assert evaluate_rule(r, GROUP, steady, 60, True).firing
    assert not evaluate_rule(r, GROUP, steady[1:], 60, True).firing  # window not covered yet
    dipped = [(0.0, 20), (30.0, 5), (60.0, 20)]
    assert not evaluate_rule(r, GROUP, dipped, 60, True).firing  # below the minimum once
    shrinking = [(0.0, 40), (30.0, 30), (60.0, 20)]
    assert not evaluate_rule(r, GROUP, shrinking, 60, True).firing
    assert not evaluate_rule(r, GROUP, [(0.0, 5), (60.0, 5)], 60, True).firing  # lag under the minimum
