"""bench/RESULTS.md is written from the benches' JSON lines: each entry with its date, machine,
load and exact command, and every figure, failed ones included; a bench that prints no figure,
or a failed one, or exits non-zero, fails ``make bench-smoke``."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench.figures import failed
from bench.results import HEADER, BenchRun, Machine, entry, record, run_bench

MACHINE = Machine(cores=2, cpu="AMD EPYC", memory_gib=23.4, kernel="Linux 6.1")
GATEWAY = {"name": "gateway", "status": "ok", "events_per_cpu_s": 78893, "x_baselines": {"raw": 0.69}}


def a_run(*figures: dict[str, object], exit_status: int = 0) -> BenchRun:
    run = BenchRun(
        [sys.executable, "-m", "bench.playback", "--repeat", "3"], datetime(2026, 12, 5, 9, 30, tzinfo=UTC)
    )
    run.figures = list(figures)
    run.exit_status = exit_status
    run.seconds, run.load_average, run.busy, run.steal = 600.0, (1.5, 2.25), 0.97, 0.021
    return run


def test_an_entry_has_the_date_machine_load_command_and_every_figure() -> None:
    quix = failed("quix", "needs the Python package quixstreams")
    text = entry(a_run(GATEWAY, quix, exit_status=1), MACHINE, "abc1234")
    assert text.startswith("## 2026-12-05 09:30 UTC: `")
    assert "-m bench.playback --repeat 3`" in text.splitlines()[0]
    assert "2 cores (AMD EPYC), 23.4 GiB memory, Linux 6.1" in text
    assert "load average 1.50 at the start, 2.25 at the end" in text
    assert "97 % busy" in text and "2.1 % stolen" in text
    assert "commit abc1234; 600 s; failed (quix: needs the Python package quixstreams; exit status 1)" in text
    assert "| gateway | ok | events_per_cpu_s 78,893 · x_baselines raw 0.69 |" in text
    assert json.dumps(quix) in text


def test_a_run_fails_on_a_failed_figure_no_figure_or_an_exit_status() -> None:
    assert a_run(GATEWAY).failures == []
    assert a_run(GATEWAY, exit_status=2).failures == ["exit status 2"]
    assert a_run().failures == ["no figure printed"]


def test_record_appends_each_entry_under_the_header(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    record(results, [a_run(GATEWAY)])
    record(results, [a_run(GATEWAY)])
    text = results.read_text()
    assert text.startswith(HEADER)
    assert text.count("## 2026-12-05 09:30 UTC") == 2
    assert Machine.this().line() in text


def test_a_bench_that_prints_no_figure_fails() -> None:
    run = run_bench("bench.figures", timeout_s=60)
    assert run.exit_status == 0
    assert run.failures == ["no figure printed"]
