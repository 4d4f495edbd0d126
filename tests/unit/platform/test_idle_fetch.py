"""The fetch wait an idle consumer backs off to on a broker that never answers early."""

from __future__ import annotations

import pytest

from app.platform.faust import transport
from app.platform.faust.idle_fetch import IDLE_AFTER_S, IdleFetchBackoff, next_fetch_wait_ms


class Clock:
    """A hand-moved monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_empty_fetches_double_the_wait_up_to_the_idle_wait_once_idle_long_enough() -> None:
    waits = [50]
    for _ in range(6):
        waits.append(next_fetch_wait_ms(waits[-1], False, IDLE_AFTER_S, 50, 400))
    assert waits == [50, 100, 200, 400, 400, 400, 400]


def test_a_consumer_that_got_records_recently_keeps_the_busy_wait() -> None:
    assert next_fetch_wait_ms(50, False, IDLE_AFTER_S / 2, 50, 400) == 50
    assert next_fetch_wait_ms(400, True, 10.0, 50, 400) == 50


def test_no_backoff_when_the_idle_wait_is_not_longer() -> None:
    assert next_fetch_wait_ms(500, False, 10.0, 500, 500) == 500
    assert next_fetch_wait_ms(500, False, 10.0, 500, 100) == 500
    assert not IdleFetchBackoff(500, 100).enabled
    assert IdleFetchBackoff(50, 400).enabled


def test_a_wait_below_the_busy_wait_is_raised_to_it() -> None:
    assert next_fetch_wait_ms(10, False, 10.0, 50, 400) == 50


def test_backoff_counts_idleness_from_the_last_fetch_with_records() -> None:
    clock = Clock()
    backoff = IdleFetchBackoff(50, 400, clock)
    wait = 50
    for _ in range(10):  # 0.5 s of empty fetches: not idle yet
        clock.now += 0.05
        wait = backoff.next_wait(wait, False)
    assert wait == 50
    clock.now += IDLE_AFTER_S
    wait = backoff.next_wait(wait, False)
    wait = backoff.next_wait(wait, False)
    assert wait == 200
    wait = backoff.next_wait(wait, True)
    assert wait == 50
    clock.now += 0.1
    assert backoff.next_wait(wait, False) == 50  # the idle clock started over


@pytest.mark.parametrize(("idle", "expected"), [(None, 50), (30, 50), (400, 400)])
def test_transport_keeps_busy_and_idle_waits_per_app(idle: int | None, expected: int) -> None:
    class Conf:
        id = f"test-idle-{idle}"

    class App:
        conf = Conf()

    transport.set_fetch_max_wait_ms(Conf.id, 50, idle)
    assert transport.fetch_max_wait_ms(App()) == 50
    assert transport.idle_fetch_max_wait_ms(App()) == expected


def test_an_app_without_waits_gets_the_early_answer_default() -> None:
    class Conf:
        id = "test-idle-unknown-app"

    class App:
        conf = Conf()

    assert transport.fetch_max_wait_ms(App()) == transport.EARLY_ANSWER_FETCH_MAX_WAIT_MS
    assert transport.idle_fetch_max_wait_ms(App()) == transport.EARLY_ANSWER_FETCH_MAX_WAIT_MS
