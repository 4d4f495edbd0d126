"""The restart backoff: doubling delays up to the cap, reset after a stable run, crash-loop flag."""

from __future__ import annotations

import pytest

from app.supervisor.backoff import BackoffPolicy, RestartTracker
from app.supervisor.settings import SupervisorSettings


def test_delays_double_from_the_initial_delay_up_to_the_cap() -> None:
    policy = BackoffPolicy(initial_s=1.0, factor=2.0, max_s=60.0)
    assert [policy.delay(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_a_huge_crash_count_stays_at_the_cap_instead_of_overflowing() -> None:
    assert BackoffPolicy(initial_s=1.0, max_s=60.0).delay(10_000) == 60.0


def test_quick_crashes_grow_the_delay_and_a_stable_run_resets_it() -> None:
    tracker = RestartTracker(BackoffPolicy(initial_s=1.0, max_s=8.0, stable_s=30.0))
    delays = [tracker.exited(ran_for_s=2.0) for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert tracker.exited(ran_for_s=30.0) == 1.0  # ran long enough: a fresh series
    assert tracker.consecutive == 1
    assert tracker.total == 6  # every restart stays counted


def test_crash_looping_from_the_configured_consecutive_crash_on() -> None:
    tracker = RestartTracker(BackoffPolicy(crash_loop_after=3, stable_s=10.0))
    flags = []
    for _ in range(4):
        tracker.exited(ran_for_s=1.0)
        flags.append(tracker.crash_looping)
    assert flags == [False, False, True, True]
    tracker.exited(ran_for_s=11.0)
    assert not tracker.crash_looping


@pytest.mark.parametrize(
    "kwargs",
    [{"initial_s": -1.0}, {"initial_s": 5.0, "max_s": 1.0}, {"factor": 0.5}, {"crash_loop_after": 0}],
)
def test_nonsensical_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(**kwargs)  # type: ignore[arg-type]


def test_delay_counts_crashes_from_one() -> None:
    with pytest.raises(ValueError):
        BackoffPolicy().delay(0)


def test_settings_build_the_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AVCC_DEV_RESTART_INITIAL_S", "0.5")
    monkeypatch.setenv("AVCC_DEV_RESTART_MAX_S", "4")
    monkeypatch.setenv("AVCC_DEV_RESTART_STABLE_S", "9")
    monkeypatch.setenv("AVCC_DEV_CRASH_LOOP_RESTARTS", "2")
    monkeypatch.setenv("AVCC_DEV_MODE", "true")  # Settings' field, not ours: ignored here
    policy = SupervisorSettings().policy()
    assert policy == BackoffPolicy(initial_s=0.5, max_s=4.0, stable_s=9.0, crash_loop_after=2)
