"""A bench whose baseline fails still reports every other figure: the failed one as a line with
``"status": "failed"`` and its reason, and an exit status of 1 (issue 37: one failed baseline
made the playback report crash in ``median_run`` and no figure was printed at all)."""

from __future__ import annotations

import json

import pytest

from bench.figures import MissingPackage, failed, is_ok, measure, print_figures
from bench.playback import median_run, result, table, with_ratios


def test_median_run_of_no_run_or_only_failed_runs_is_a_failed_figure() -> None:
    assert median_run("quix", []) == failed("quix", "not run")
    crashed = failed("quix", "exited 1 without a figure: ImportError")
    assert median_run("quix", [failed("quix", "timeout"), crashed]) == crashed


def test_median_run_takes_the_measured_runs_and_counts_the_failed_ones() -> None:
    runs = [result("raw", 1000, 1.0, 1.0), failed("raw", "timeout"), result("raw", 1000, 1.0, 0.5)]
    chosen = median_run("raw", runs)
    assert is_ok(chosen)
    assert chosen["events_per_cpu_s"] == 1000
    assert chosen["runs_events_per_cpu_s"] == [1000, 2000]
    assert chosen["failed_runs"] == 1


def test_a_failed_baseline_is_a_row_of_its_own_and_the_others_keep_their_ratios() -> None:
    figures = with_ratios(
        [
            result("sink", 1000, 1.0, 0.5),
            failed("quix", "needs the Python package quixstreams"),
            result("raw", 1000, 1.0, 0.25),
        ]
    )
    assert figures[0]["x_baselines"] == {"raw": 0.5}
    assert "x_baselines" not in figures[1]
    text = table(figures)
    assert "quix      failed: needs the Python package quixstreams" in text
    assert "x quix" not in text
    assert "x raw" in text


def test_a_figure_that_raises_is_reported_failed_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> dict[str, object]:
        raise MissingPackage("quixstreams")

    figures = [measure("quix", broken), measure("raw", lambda: {"events": 3})]
    assert print_figures(figures) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["name"], line["status"]) for line in lines] == [("quix", "failed"), ("raw", "ok")]
    assert "quixstreams" in lines[0]["reason"]
    assert "make install" in lines[0]["reason"]


def test_every_figure_measured_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert print_figures([measure("raw", lambda: {"events": 3})]) == 0
