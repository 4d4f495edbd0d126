"""The group supervisor on real (tiny) processes and a hand-driven clock: a crashing group is
restarted with growing delays, the others are left alone, and a crash loop is reported loudly; a
group whose tables are ahead of the broker is reported once and left stopped; a SIGKILLed
supervisor takes its workers with it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.platform.groups import GroupSpec, group_spec
from app.supervisor.backoff import BackoffPolicy
from app.supervisor.groups import GroupSupervisor, describe_exit
from app.worker import EXIT_TABLES_AHEAD_OF_BROKER as EXIT_TABLES
from tests.processes import alive

ROOT = Path(__file__).resolve().parents[3]
CRASHER = group_spec("review")
STEADY = group_spec("code")


def _command(spec: GroupSpec) -> list[str]:
    body = "import sys; print('crashing'); sys.exit(3)" if spec is CRASHER else "import time; time.sleep(600)"
    return [sys.executable, "-c", body]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _wait_exit(supervisor: GroupSupervisor, name: str) -> None:
    deadline = time.monotonic() + 30
    while name in supervisor.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert name not in supervisor.pids(), f"{name} did not exit"


def test_a_crashing_group_is_restarted_with_growing_delays_and_the_rest_keeps_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _Clock()
    supervisor = GroupSupervisor(
        [STEADY, CRASHER],
        env={},
        logs=tmp_path,
        policy=BackoffPolicy(initial_s=1.0, max_s=4.0, stable_s=60.0, crash_loop_after=4),
        web_port=lambda spec: 6066 + spec.port_offset,
        command=_command,
        clock=clock,
    )
    caplog.set_level(logging.INFO, logger="avcc.dev")
    try:
        supervisor.start_all()
        steady_pid = supervisor.pids()["code"]
        waits = []
        for _ in range(5):
            _wait_exit(supervisor, "review")
            supervisor.tick()  # notices the exit, schedules the restart
            started = clock.now
            while "review" not in supervisor.pids():
                clock.now += 0.5
                supervisor.tick()
            waits.append(clock.now - started)
        assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]
        assert supervisor.pids()["code"] == steady_pid, "a crashing group must not touch the others"
        assert supervisor.restarts() == {"code": 0, "review": 5}
    finally:
        supervisor.stop(timeout=10)
    assert not supervisor.pids()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0].startswith("group review exited (exit status 3) after 0.0s; restart #1 in 1.0s")
    loops = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(loops) == 2 and "CrashLoopBackOff" in loops[0] and "crashing" in loops[0]
    assert "restart #4 in 4.0s" in loops[0]
    assert (tmp_path / "review.log").read_text().count("crashing") >= 5


def test_stop_cancels_pending_restarts(tmp_path: Path) -> None:
    clock = _Clock()
    supervisor = GroupSupervisor(
        [CRASHER],
        env={},
        logs=tmp_path,
        policy=BackoffPolicy(initial_s=5.0),
        web_port=lambda spec: 0,
        command=_command,
        clock=clock,
    )
    supervisor.start_all()
    _wait_exit(supervisor, "review")
    supervisor.tick()
    supervisor.stop(timeout=5)
    clock.now += 60
    supervisor.tick()
    assert supervisor.pids() == {}


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (-signal.SIGABRT, "killed by SIGABRT (a native abort, e.g. a failed librdkafka assertion)"),
        (-signal.SIGKILL, "killed by SIGKILL"),
        (70, "exit status 70 (the worker stopped itself: stalled partitions)"),
        (1, "exit status 1"),
    ],
)
def test_exit_statuses_in_words(status: int, words: str) -> None:
    assert describe_exit(status) == words


def test_a_group_whose_tables_are_ahead_of_the_broker_is_reported_once_and_not_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def command(spec: GroupSpec) -> list[str]:
        if spec is CRASHER:
            return [sys.executable, "-c", f"import sys; print('ConsistencyError'); sys.exit({EXIT_TABLES})"]
        return [sys.executable, "-c", "import time; time.sleep(600)"]

    clock = _Clock()
    supervisor = GroupSupervisor(
        [STEADY, CRASHER],
        env={"AVCC_DATA_DIR": str(tmp_path / "var")},
        logs=tmp_path,
        policy=BackoffPolicy(initial_s=1.0, max_s=4.0),
        web_port=lambda spec: 6066 + spec.port_offset,
        command=command,
        clock=clock,
    )
    caplog.set_level(logging.INFO, logger="avcc.dev")
    try:
        supervisor.start_all()
        _wait_exit(supervisor, "review")
        for _ in range(20):  # far past every backoff delay
            supervisor.tick()
            clock.now += 5.0
        assert "review" not in supervisor.pids(), "a restart cannot mend it: the group stays stopped"
        assert "code" in supervisor.pids(), "the other groups keep running"
        assert supervisor.restarts() == {"code": 0, "review": 0}
        assert set(supervisor.given_up()) == {"review"}
    finally:
        supervisor.stop(timeout=10)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith(
        f"group review stopped (exit status {EXIT_TABLES} (its tables are ahead of the broker's changelogs))"
    )
    assert "is NOT restarted" in errors[0]
    assert f"delete {tmp_path / 'var' / 'workers' / 'review'}" in errors[0]
    assert "make clean" in errors[0] and "ConsistencyError" in errors[0]  # the end of its log
    assert (tmp_path / "review.log").read_text().count("ConsistencyError") == 1


#: A parent that starts one steady group, says its worker's pid, and waits to be killed.
_PARENT = """
import sys, time
from pathlib import Path
from app.platform.groups import group_spec
from app.supervisor.backoff import BackoffPolicy
from app.supervisor.groups import GroupSupervisor

supervisor = GroupSupervisor(
    [group_spec("code")],
    env={},
    logs=Path(sys.argv[1]),
    policy=BackoffPolicy(),
    web_port=lambda spec: 0,
    command=lambda spec: [sys.executable, "-c", "import time; time.sleep(600)"],
)
supervisor.start_all()
print(supervisor.pids()["code"], flush=True)
time.sleep(600)
"""


def test_a_sigkilled_supervisor_takes_its_workers_with_it(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path)], stdout=subprocess.PIPE, cwd=ROOT
    )
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    try:
        assert alive(worker)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker), "a worker outlived its SIGKILLed supervisor"
    finally:
        parent.kill()
        parent.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
