"""Runs benches and writes their dated results: ``make bench`` and ``make bench-smoke``.

    python -m bench.results [--record bench/RESULTS.md] [--timeout S] 'bench.playback --repeat 3' ...

Each argument is one bench: its module and its arguments. Each runs as
``python -m MODULE ARGS`` with its output passed through as it comes; its figures are the JSON
lines it prints (one per figure, ``"status": "ok"`` or ``"failed"``, see :mod:`bench.figures`).
A bench fails when it exits non-zero, prints no figure, reports a failed one or outlives
``--timeout``; every bench runs, and the exit status is 1 when any failed. Nothing is asserted
about the figures themselves.

With ``--record FILE`` each run is appended to ``FILE`` (``bench/RESULTS.md``): its date, the
machine (cores, CPU model, memory, kernel), the load while it ran (load average, and the share
of every core busy and stolen by the hypervisor from ``/proc/stat``), the exact command, the
commit, and every figure, baselines beside the measured ones, as a table and as the JSON lines
it printed. The file is only ever written from those lines, never by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from bench.figures import is_ok

__all__ = ["BenchRun", "Machine", "entry", "main", "run_bench"]

ROOT: Final = Path(__file__).resolve().parents[1]
HEADER: Final = """# Bench results

Written by `python -m bench.results` (`make bench`) from the JSON lines the benches print: one
entry per run, oldest first, each with its date, machine, load and exact command. Never edited
by hand; the figures are measured, never asserted. What each figure means: the docstrings of
`bench/playback.py` and `bench/lifecycle.py`.
"""
#: Seconds a bench gets between SIGINT (on ``--timeout``) and SIGKILL.
STOP_GRACE_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """The machine's CPU time so far, all cores together, in ``/proc/stat`` ticks."""

    total: int
    idle: int
    steal: int

    @classmethod
    def now(cls) -> CpuTimes:
        """Read ``/proc/stat``'s ``cpu`` line (user nice system idle iowait irq softirq steal ...)."""
        with open("/proc/stat") as stat:
            ticks = [int(v) for v in stat.readline().split()[1:]]
        # guest time is already counted in user time
        return cls(total=sum(ticks[:8]), idle=ticks[3] + ticks[4], steal=ticks[7])


def _load_average() -> float:
    return os.getloadavg()[0]


@dataclass(frozen=True, slots=True)
class Machine:
    """What a figure was measured on."""

    cores: int
    cpu: str
    memory_gib: float
    kernel: str

    @classmethod
    def this(cls) -> Machine:
        """This machine, from ``/proc``."""
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or "unknown CPU",
        )
        kib = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        )
        return cls(os.cpu_count() or 0, cpu, kib / 2**20, f"{platform.system()} {platform.release()}")

    def line(self) -> str:
        """One line for the results file."""
        return f"{self.cores} cores ({self.cpu}), {self.memory_gib:.1f} GiB memory, {self.kernel}"


@dataclass(slots=True)
class BenchRun:
    """One bench run: its command, when and how long, its exit status, figures and load."""

    command: list[str]
    started: datetime
    seconds: float = 0.0
    exit_status: int | None = None
    timed_out: bool = False
    figures: list[dict[str, Any]] = field(default_factory=list)
    load_average: tuple[float, float] = (0.0, 0.0)
    #: Shares (0..1) of all the cores' time that was busy, and stolen, while the bench ran.
    busy: float = 0.0
    steal: float = 0.0

    @property
    def failures(self) -> list[str]:
        """Why this run counts as failed (empty: every figure measured)."""
        reasons = [f"{f['name']}: {f.get('reason')}" for f in self.figures if not is_ok(f)]
        if self.timed_out:
            reasons.append("timed out")
        elif self.exit_status != 0:
            reasons.append(f"exit status {self.exit_status}")
        if not self.figures:
            reasons.append("no figure printed")
        return reasons

    def shown_command(self) -> str:
        """The command as typed in the repository's directory."""
        python = Path(self.command[0])
        shown = python.relative_to(ROOT) if python.is_relative_to(ROOT) else python
        return shlex.join([str(shown), *self.command[1:]])


def _figure(line: str) -> dict[str, Any] | None:
    """The figure a bench's output line holds, else ``None``."""
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) and "name" in value else None


def _stop(process: subprocess.Popen[str]) -> None:
    """SIGINT the bench's process group, as Ctrl-C would: the bench's ``finally`` stops its
    broker and workers and removes its work dir. SIGKILL it when it is not done in time (its
    broker and workers then die with it, ``PR_SET_PDEATHSIG``)."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_bench(spec: str, timeout_s: float | None) -> BenchRun:
    """Run the bench ``spec`` (``MODULE ARGS``), its output passed through, and collect its figures."""
    run = BenchRun([sys.executable, "-m", *shlex.split(spec)], datetime.now(UTC))
    print(f"# {run.shown_command()}", file=sys.stderr, flush=True)
    before, load_before, started = CpuTimes.now(), _load_average(), time.monotonic()
    process = subprocess.Popen(
        run.command, cwd=ROOT, stdout=subprocess.PIPE, text=True, bufsize=1, start_new_session=True
    )

    def relay() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            figure = _figure(line.strip())
            if figure is not None:
                run.figures.append(figure)

    reader = threading.Thread(target=relay, name="bench-output", daemon=True)
    reader.start()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        run.timed_out = True
    finally:
        if process.poll() is None:
            _stop(process)
    reader.join(STOP_GRACE_S)
    after = CpuTimes.now()
    run.seconds = time.monotonic() - started
    run.exit_status = process.returncode
    run.load_average = (load_before, _load_average())
    total = max(1, after.total - before.total)
    run.busy = 1 - (after.idle - before.idle) / total
    run.steal = (after.steal - before.steal) / total
    return run


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_value(v)}" for k, v in value.items())
    if isinstance(value, list):
        return " / ".join(_value(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def entry(run: BenchRun, machine: Machine, commit: str) -> str:
    """The results file's entry of ``run``: date, machine, load, command, commit, figures."""
    status = "ok" if not run.failures else "failed (" + "; ".join(run.failures) + ")"
    lines = [
        f"## {run.started:%Y-%m-%d %H:%M} UTC: `{run.shown_command()}`",
        "",
        f"- machine: {machine.line()}",
        f"- load: 1-minute load average {run.load_average[0]:.2f} at the start, "
        f"{run.load_average[1]:.2f} at the end; the cores were {100 * run.busy:.0f} % busy "
        f"(this bench included), {100 * run.steal:.1f} % stolen by the hypervisor",
        f"- commit {commit}; {run.seconds:.0f} s; {status}",
        "",
        "| figure | status | figures |",
        "|---|---|---|",
    ]
    for figure in run.figures:
        rest = {k: v for k, v in figure.items() if k not in ("name", "status")}
        cells = " · ".join(f"{k} {_value(v)}" for k, v in rest.items())
        lines.append(f"| {figure['name']} | {figure.get('status', 'ok')} | {cells} |")
    lines += ["", "```json", *(json.dumps(figure) for figure in run.figures), "```", ""]
    return "\n".join(lines)


def _commit() -> str:
    """The checked-out commit (with ``+changes`` when the tree differs from it)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" +changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def record(path: Path, runs: Sequence[BenchRun]) -> None:
    """Append an entry per run to the results file ``path`` (created with its header)."""
    machine, commit = Machine.this(), _commit()
    text = path.read_text() if path.exists() else HEADER
    path.write_text(text.rstrip("\n") + "\n\n" + "\n".join(entry(run, machine, commit) for run in runs))


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument(
        "benches", nargs="+", metavar="'MODULE ARGS'", help="a bench to run, e.g. 'bench.lifecycle'"
    )
    parser.add_argument("--record", type=Path, default=None, help="append each run to this results file")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds a bench may run (default: no limit)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    runs = [run_bench(spec, args.timeout) for spec in args.benches]
    if args.record is not None:
        record(args.record, runs)
    print("", file=sys.stderr)
    for run in runs:
        measured = sum(1 for f in run.figures if is_ok(f))
        outcome = "ok" if not run.failures else "FAILED: " + "; ".join(run.failures)
        counts = f"{measured} of {len(run.figures)} figures measured"
        print(f"# {run.shown_command()}: {counts}, {run.seconds:.0f} s, {outcome}", file=sys.stderr)
    print(f"# {len(runs)} benches in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 1 if any(run.failures for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
