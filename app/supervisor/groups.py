"""The dev stack's group supervisor: one worker process per agent group, restarted with backoff.

A group that exits (crash, ``SIGKILL``, a native ``abort()`` inside librdkafka) is started again
after the delay its :class:`~app.supervisor.backoff.RestartTracker` gives, and every exit is
logged with its cause and counted. One group dying, even in a loop, never stops the others: a
group that keeps crashing is reported loudly (like Kubernetes' ``CrashLoopBackOff``) with the
end of its log, and is still retried at the capped delay. No message is lost meanwhile: workers
commit offsets only after processing (at-least-once) and dedup redeliveries.

The one exit that is not restarted is a worker whose tables are ahead of the broker's changelogs
(:data:`~app.worker.EXIT_TABLES_AHEAD_OF_BROKER`): every restart would stop the same way, so the
group is reported once, with what to delete, and left stopped while the others run.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.platform.groups import GroupSpec
from app.servers.process import die_with_parent
from app.supervisor.backoff import BackoffPolicy, RestartTracker
from app.worker import EXIT_TABLES_AHEAD_OF_BROKER

__all__ = ["GroupSupervisor", "describe_exit", "worker_command"]

log = logging.getLogger("avcc.dev")

#: Exit status of a worker that stopped itself because it stalled (``AVCC_WORKER_STALL_S``).
_STALLED = 70
_TAIL_LINES = 15


def describe_exit(status: int) -> str:
    """A worker's exit status in words (``Popen.returncode``: negative = killed by that signal)."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        if -status == signal.SIGABRT:
            return f"killed by {name} (a native abort, e.g. a failed librdkafka assertion)"
        return f"killed by {name}"
    if status == _STALLED:
        return f"exit status {status} (the worker stopped itself: stalled partitions)"
    if status == EXIT_TABLES_AHEAD_OF_BROKER:
        return f"exit status {status} (its tables are ahead of the broker's changelogs)"
    return f"exit status {status}"


def worker_command(spec: GroupSpec) -> list[str]:
    """``python -m app worker GROUP``: the same command a Kubernetes pod runs."""
    return [sys.executable, "-m", "app", "worker", spec.name]


def _log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 8000))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(slots=True)
class _Member:
    """One group under supervision: its current process and restart history."""

    spec: GroupSpec
    tracker: RestartTracker
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    exits: list[int] = field(default_factory=list)
    #: Set when the group is left stopped (a restart cannot help), with why.
    given_up: str | None = None


class GroupSupervisor:
    """Starts one ``avcc worker GROUP`` per group and keeps each running; call :meth:`tick` often.

    Each worker gets SIGTERM when the thread that started it dies (``PR_SET_PDEATHSIG``): a
    SIGKILLed ``avcc dev`` takes its workers with it. Start and tick from the main thread."""

    def __init__(
        self,
        groups: Iterable[GroupSpec],
        *,
        env: Mapping[str, str],
        logs: Path,
        policy: BackoffPolicy,
        web_port: Callable[[GroupSpec], int],
        command: Callable[[GroupSpec], list[str]] = worker_command,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.env = dict(env)
        self.command = command
        self.logs = logs
        self.web_port = web_port
        self.clock = clock
        self._members = [_Member(spec, RestartTracker(policy)) for spec in groups]

    def log_path(self, spec: GroupSpec) -> Path:
        """The file a group's worker writes its output to (appended across restarts)."""
        return self.logs / f"{spec.name}.log"

    def start_all(self) -> None:
        """Start every group's worker once."""
        self.logs.mkdir(parents=True, exist_ok=True)
        for member in self._members:
            self._launch(member)

    def tick(self) -> None:
        """Notice exited workers (schedule their restart) and start those whose delay is over."""
        now = self.clock()
        for member in self._members:
            if member.restart_at is None and member.process is not None:
                status = member.process.poll()
                if status is not None:
                    self._exited(member, status, now)
            if member.restart_at is not None and now >= member.restart_at:
                self._launch(member)

    def given_up(self) -> dict[str, str]:
        """Groups left stopped because a restart cannot help them, with the reason."""
        return {m.spec.name: m.given_up for m in self._members if m.given_up is not None}

    def restarts(self) -> dict[str, int]:
        """Restarts so far per group (every exit of a worker schedules one)."""
        return {m.spec.name: m.tracker.total for m in self._members}

    def pids(self) -> dict[str, int]:
        """PID of each group's running worker (groups waiting for their restart are left out)."""
        return {
            m.spec.name: m.process.pid
            for m in self._members
            if m.process is not None and m.process.poll() is None
        }

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every worker, wait up to ``timeout`` in total, SIGKILL the rest; no more restarts."""
        for member in self._members:
            member.restart_at = None
            if member.process is not None and member.process.poll() is None:
                member.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for member in self._members:
            if member.process is None:
                continue
            try:
                member.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("group %s ignored SIGTERM; killing it", member.spec.name)
                member.process.kill()
                member.process.wait()
        restarted = {name: n for name, n in self.restarts().items() if n}
        if restarted:
            log.info("restarts while the stack ran: %s", restarted)

    # -- internals ----------------------------------------------------------------

    def _launch(self, member: _Member) -> None:
        path = self.log_path(member.spec)
        with path.open("ab") as out:
            member.process = subprocess.Popen(
                self.command(member.spec),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=Path.cwd(),
                preexec_fn=die_with_parent(os.getpid()),
            )
        member.started_at = self.clock()
        member.restart_at = None
        verb = "restarted" if member.tracker.total else "started"
        log.info(
            "%s group %s (pid %d, web port %d, log %s)",
            verb,
            member.spec.name,
            member.process.pid,
            self.web_port(member.spec),
            path,
        )

    def _exited(self, member: _Member, status: int, now: float) -> None:
        ran_for = now - member.started_at
        if status == EXIT_TABLES_AHEAD_OF_BROKER:
            self._give_up(member, status, ran_for)
            return
        delay = member.tracker.exited(ran_for)
        member.exits.append(status)
        member.restart_at = now + delay
        name = member.spec.name
        if member.tracker.crash_looping:
            log.error(
                "group %s is crash-looping (CrashLoopBackOff): %d exits in a row, the last %s after "
                "%.1fs; restart #%d in %.1fs. End of %s:\n%s",
                name,
                member.tracker.consecutive,
                describe_exit(status),
                ran_for,
                member.tracker.total,
                delay,
                self.log_path(member.spec),
                _log_tail(self.log_path(member.spec)),
            )
        else:
            log.warning(
                "group %s exited (%s) after %.1fs; restart #%d in %.1fs",
                name,
                describe_exit(status),
                ran_for,
                member.tracker.total,
                delay,
            )

    def _give_up(self, member: _Member, status: int, ran_for: float) -> None:
        """Leave a group stopped whose next start would stop the same way, and say what to do."""
        member.process = None
        member.restart_at = None
        member.exits.append(status)
        data = Path(self.env.get("AVCC_DATA_DIR", "var")) / "workers" / member.spec.name
        member.given_up = (
            f"its tables in {data} are ahead of the broker's changelogs (the broker's data was deleted "
            f"or replaced); delete {data} to rebuild them from the broker, or `make clean` for a fresh stack"
        )
        log.error(
            "group %s stopped (%s) after %.1fs and is NOT restarted: %s. End of %s:\n%s",
            member.spec.name,
            describe_exit(status),
            ran_for,
            member.given_up,
            self.log_path(member.spec),
            _log_tail(self.log_path(member.spec)),
        )
