"""stop_together stops members concurrently and still reports a failed stop."""

from __future__ import annotations

import threading

import pytest

from testing.processes import stop_together


class _Member:
    """Its ``stop`` returns only once every member's stop has begun (a shared barrier): called
    one after another, the first would time out and break the barrier."""

    def __init__(self, barrier: threading.Barrier, fail: bool = False) -> None:
        self.barrier = barrier
        self.fail = fail
        self.stopped = False

    def stop(self) -> None:
        self.barrier.wait(timeout=10)
        self.stopped = True
        if self.fail:
            raise RuntimeError("stop failed")


def test_every_member_is_stopping_at_the_same_time() -> None:
    barrier = threading.Barrier(4)
    members = [_Member(barrier) for _ in range(4)]
    stop_together(members)
    assert all(m.stopped for m in members)
    assert not barrier.broken


def test_a_failed_stop_is_raised_after_every_other_member_stopped() -> None:
    barrier = threading.Barrier(3)
    members = [_Member(barrier), _Member(barrier, fail=True), _Member(barrier)]
    with pytest.raises(RuntimeError, match="stop failed"):
        stop_together(members)
    assert all(m.stopped for m in members)
