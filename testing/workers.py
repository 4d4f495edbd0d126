"""Agent-group workers as managed subprocesses, ready once their ``/ready`` answers 200: how the
benches and the integration stacks start the pipeline's workers (``avcc worker GROUP``, the
command a pod runs), so none of them takes an open port for a worker that can serve."""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping
from pathlib import Path

from app.platform.groups import group_spec
from app.servers.process import LOOPBACK, ManagedProcess
from app.supervisor.groups import worker_command

__all__ = ["group_worker", "worker_ready"]


def worker_ready(host: str, port: int) -> bool:
    """Whether the worker on ``host:port`` answers ``GET /ready`` with 200 (a 503 raises
    ``HTTPError``, which :class:`ManagedProcess` takes for "not ready yet")."""
    with urllib.request.urlopen(f"http://{host}:{port}/ready", timeout=2) as response:
        return bool(response.status == 200)


def group_worker(
    group: str,
    *,
    port: int,
    env: Mapping[str, str],
    data_dir: Path,
    log_path: Path,
    host: str = LOOPBACK,
    name: str | None = None,
    cwd: Path | None = None,
    ready_timeout: float = 120.0,
    stop_timeout: float = 20.0,
) -> ManagedProcess:
    """A worker of ``group`` (not started yet) serving on ``host:port``, with the complete
    environment ``env`` plus its data dir and address. It is ready when its ``/ready`` is (assigned,
    tables recovered, the nonces of the skew window read), and it dies with the thread that
    starts it."""
    return ManagedProcess(
        name or group,
        [*worker_command(group_spec(group)), "--web-port", str(port)],
        log_path=log_path,
        cwd=cwd,
        env={**env, "AVCC_DATA_DIR": str(data_dir), "AVCC_WEB_HOST": host},
        ready=lambda: worker_ready(host, port),
        ready_timeout=ready_timeout,
        stop_timeout=stop_timeout,
        die_with_parent=True,
    )
