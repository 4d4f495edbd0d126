"""Subprocess supervision shared by the locally managed servers (Kafka, ganache; the test harness's too)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from app.platform.errors import AvccError

__all__ = [
    "LOOPBACK",
    "ManagedProcess",
    "ManagedServer",
    "ServerNotInstalled",
    "ServerStartError",
    "die_with_parent",
    "port_is_open",
]

LOOPBACK = "127.0.0.1"


_PR_SET_PDEATHSIG = 1
_LOG_TAIL_BYTES = 4000


class ServerStartError(AvccError):
    """A managed server was started but did not become ready (or exited early)."""


class ServerNotInstalled(ServerStartError):
    """A managed server cannot even be launched: its binary, JVM or jars are missing."""


# --------------------------------------------------------------------------- ports


def port_is_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# ----------------------------------------------------------------------- processes

_live: set[ManagedProcess] = set()
_live_lock = threading.Lock()


def _stop_all_at_exit() -> None:
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.stop(timeout=5.0)


atexit.register(_stop_all_at_exit)


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when its parent thread dies, so a
    SIGKILLed (or OOM-killed) parent leaves no server or worker behind holding its ports."""

    def _preexec() -> None:
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # parent already gone before prctl took effect
            os._exit(1)

    return _preexec


def _tail(path: Path, limit: int = _LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


class _Restartable:
    """``restart()`` and ``with``: a stop, then a start (same ports, same data); started on
    entering the block, stopped on leaving it."""

    def start(self) -> None:
        """Start (and wait for readiness)."""
        raise NotImplementedError

    def stop(self) -> object:
        """Stop gracefully."""
        raise NotImplementedError

    def restart(self) -> None:
        """Stop gracefully, then start again (and wait for readiness)."""
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ManagedProcess(_Restartable):
    """One server subprocess in its own process group, logging to a file, with a readiness probe.

    ``env`` is the complete environment (``None`` inherits ours). ``ready`` is polled every
    0.1 s after launch; exceptions count as "not ready". With ``die_with_parent`` Linux sends
    the child SIGTERM if the thread that started it dies (so start it from a long-lived thread).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        ready: Callable[[], bool] | None = None,
        ready_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        die_with_parent: bool = False,
        diagnostic_logs: Sequence[Path] = (),
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.ready = ready
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.die_with_parent = die_with_parent
        self.diagnostic_logs = list(diagnostic_logs)
        self._popen: subprocess.Popen[bytes] | None = None
        self._start_lock = threading.Lock()
        self.started_at: float | None = None
        self.ready_after: float | None = None

    # -- state ------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """PID of the running process (also its process-group id), else ``None``."""
        return self._popen.pid if self._popen is not None and self.running else None

    @property
    def running(self) -> bool:
        """True while the process has been started and has not exited."""
        return self._popen is not None and self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last run, ``None`` while running or never started."""
        return None if self._popen is None else self._popen.poll()

    def log_tail(self, limit: int = _LOG_TAIL_BYTES) -> str:
        """Last ``limit`` bytes of the process log and of any diagnostic logs."""
        parts = [f"--- {self.log_path} ---\n{_tail(self.log_path, limit)}"]
        for extra in self.diagnostic_logs:
            if extra.exists():
                parts.append(f"--- {extra} ---\n{_tail(extra, limit)}")
        return "\n".join(parts)

    # -- lifecycle ----------------------------------------------------------------

    def _launch(self) -> None:
        """Spawn the process (the caller holds the start lock)."""
        exe = self.argv[0]
        if os.sep in exe and not os.access(exe, os.X_OK):
            raise ServerNotInstalled(f"{self.name}: {exe} is not an executable file")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        preexec = die_with_parent(os.getpid()) if self.die_with_parent else None
        with self.log_path.open("ab") as log:
            log.write(
                f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(self.argv)}\n".encode()
            )
            log.flush()
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.cwd,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=preexec,
                )
            except FileNotFoundError as exc:
                raise ServerNotInstalled(f"{self.name}: cannot execute {exe}: {exc}") from exc
        self.started_at = time.monotonic()
        self.ready_after = None
        with _live_lock:
            _live.add(self)

    def start(self, *, wait: bool = True) -> None:
        """Launch the process (no-op if running) and, by default, wait until it is ready.

        Atomic: two threads starting the same process (a supervisor and a test) launch it once.
        """
        with self._start_lock:
            if self.running:
                return
            self._launch()
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.kill()
                raise

    def wait_ready(self, timeout: float | None = None) -> float:
        """Poll the readiness probe until it returns True; return seconds since start."""
        budget = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        last_error: BaseException | None = None
        while True:
            if self._popen is None:
                raise ServerStartError(f"{self.name}: not started")
            code = self._popen.poll()
            if code is not None:
                raise ServerStartError(
                    f"{self.name} exited with status {code} before becoming ready\n{self.log_tail()}"
                )
            try:
                if self.ready is None or self.ready():
                    break
            except Exception as exc:  # a failing probe means "not ready yet"
                last_error = exc
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self.name} not ready after {budget:.0f}s (last probe error: {last_error!r})\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.1)
        self.ready_after = time.monotonic() - (self.started_at or time.monotonic())
        return self.ready_after

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, sig)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM the process group, wait up to ``timeout``, then SIGKILL it; return the exit status."""
        if self._popen is None:
            return None
        if self._popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self._popen.wait(self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self._popen.wait()
        self._signal_group(signal.SIGKILL)  # stray children left in the group
        with _live_lock:
            _live.discard(self)
        return self._popen.returncode

    def kill(self) -> int | None:
        """SIGKILL the whole process group at once (simulates a crash); return the exit status."""
        if self._popen is None:
            return None
        self._signal_group(signal.SIGKILL)
        self._popen.wait()
        with _live_lock:
            _live.discard(self)
        return self._popen.returncode

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else f"exited={self.returncode}"
        return f"<ManagedProcess {self.name} {state}>"


class ManagedServer(_Restartable, ABC):
    """Base for a server with a data directory, a generated config and a readiness probe."""

    name: ClassVar[str] = "server"

    def __init__(
        self,
        data_dir: Path,
        *,
        ready_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        die_with_parent: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.die_with_parent = die_with_parent
        self._process: ManagedProcess | None = None

    # -- hooks for subclasses ------------------------------------------------------

    def _prepare(self) -> None:
        """Write configuration, create directories; called before every start."""

    @abstractmethod
    def _command(self) -> list[str]:
        """The argv that runs the server in the foreground."""

    @abstractmethod
    def _probe(self) -> bool:
        """True once the server answers real protocol requests."""

    def _env(self) -> dict[str, str] | None:
        """The server's complete environment (``None``: inherit this process's)."""
        return None

    def _diagnostic_logs(self) -> list[Path]:
        """Extra log files worth quoting when start-up fails."""
        return []

    # -- public API ----------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        """File receiving the server's stdout and stderr."""
        return self.data_dir / f"{self.name}.log"

    @property
    def process(self) -> ManagedProcess | None:
        """The underlying process handle (``None`` before the first start)."""
        return self._process

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._process is not None and self._process.running

    @property
    def pid(self) -> int | None:
        """PID of the server process while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def startup_seconds(self) -> float | None:
        """Seconds the last start took until the readiness probe succeeded."""
        return self._process.ready_after if self._process is not None else None

    def start(self, *, wait: bool = True) -> None:
        """Start the server (no-op if running) and, by default, block until it is ready
        (``wait=False``: servers that only become ready together, like a KRaft quorum)."""
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare()
        self._process = ManagedProcess(
            self.name,
            self._command(),
            log_path=self.log_path,
            cwd=self.data_dir,
            env=self._env(),
            ready=self._probe,
            ready_timeout=self.ready_timeout,
            stop_timeout=self.stop_timeout,
            die_with_parent=self.die_with_parent,
            diagnostic_logs=self._diagnostic_logs(),
        )
        self._process.start(wait=wait)

    def ready_now(self) -> bool:
        """One readiness probe now: True when the server runs and answers (a failing probe is False)."""
        if not self.running:
            return False
        try:
            return self._probe()
        except Exception:  # a probe that fails means "not ready yet"
            return False

    def wait_ready(self, timeout: float | None = None) -> float:
        """Block until the started server is ready; seconds since its start."""
        if self._process is None:
            raise ServerStartError(f"{self.name}: not started")
        try:
            return self._process.wait_ready(timeout)
        except BaseException:
            self._process.kill()
            raise

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM, then SIGKILL after the stop timeout); data is kept."""
        if self._process is not None:
            self._process.stop()

    def kill(self) -> None:
        """SIGKILL the server (crash simulation); data on disk is kept."""
        if self._process is not None:
            self._process.kill()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {'running' if self.running else 'stopped'} data_dir={self.data_dir}>"
