"""A worker of the lag tests as a managed process (its log in, and run from, the test's own
directory) and the status probe of its web port: how the ops and lag workers those tests start
are built, in one place."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from app.servers import ManagedProcess

__all__ = ["http_status", "worker_process"]


def http_status(url: str) -> int:
    """The status ``GET url`` answers; 0 while nothing answers (the worker is still starting)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def worker_process(
    name: str,
    argv: Sequence[str],
    work_dir: Path,
    env: Mapping[str, str],
    *,
    ready: Callable[[], bool],
    ready_timeout: float = 60,
) -> ManagedProcess:
    """Worker ``name`` (not started yet) running ``argv`` in ``work_dir``, logging to
    ``work_dir/<name>.log``; it dies with the thread that starts it."""
    return ManagedProcess(
        name,
        argv,
        log_path=work_dir / f"{name}.log",
        cwd=work_dir,
        env=env,
        ready=ready,
        ready_timeout=ready_timeout,
        stop_timeout=30,
        die_with_parent=True,
    )
