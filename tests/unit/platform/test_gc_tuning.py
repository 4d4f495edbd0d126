"""The batch loops raise Python's gen-0 GC threshold once, process-wide, and never lower it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from app.platform.gc_tuning import raise_gen0_threshold
from app.playback.anomaly.settings import AnomalySettings
from app.playback.sink.settings import SinkSettings


@pytest.fixture(autouse=True)
def python_defaults() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_the_gen0_threshold_is_raised_and_the_older_generations_kept() -> None:
    raise_gen0_threshold(50_000)
    assert gc.get_threshold() == (50_000, 10, 10)


def test_a_lower_threshold_never_lowers_it_and_zero_leaves_it() -> None:
    raise_gen0_threshold(50_000)
    raise_gen0_threshold(1_000)
    raise_gen0_threshold(0)
    assert gc.get_threshold() == (50_000, 10, 10)


def test_both_batch_loops_raise_it_by_default() -> None:
    assert AnomalySettings().gc_gen0_threshold > 700
    assert SinkSettings().gc_gen0_threshold > 700
