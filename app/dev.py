"""The local all-in-one stack: embedded Tansu broker, chDB, the topic plan and every agent group.

DEV ONLY: Tansu runs on memory storage (everything is lost when it stops), the shipped HMAC key
``dev``/``dev-secret`` and operator ``admin``/``admin`` are enabled, and a broker that cannot
honour the core producer profile is only warned about.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from app.dev_chain import DevChain, dev_chain_port, start_dev_chain
from app.platform.groups import GROUPS, GroupSpec
from app.platform.kafka.admin import apply_plan
from app.platform.redaction import redact_url
from app.platform.settings import Settings, get_settings
from app.servers.tansu import TansuBroker

__all__ = ["run_dev_stack"]

#: A group that exits is restarted, unless it exited this often within the window.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0

log = logging.getLogger("avcc.dev")

BANNER = """
==============================================================================
 AVCC dev stack — DEV ONLY
   * embedded Tansu broker on {bootstrap} (memory storage: lost on restart)
   * ClickHouse: {clickhouse}
   * chain: {chain}
   * HMAC API key 'dev' / secret 'dev-secret' is ENABLED (never use outside dev)
   * operator console login admin / admin
 Console: http://{host}:{port}/dlq   lag: http://{host}:{port}/lag
 Apply:   POST http://{host}:{code_port}/v1/avcc/applications
==============================================================================
"""


def available_groups(wanted: list[str] | None) -> list[GroupSpec]:
    """Groups whose agent module exists (optionally only those named)."""
    found = [g for g in GROUPS if importlib.util.find_spec(g.module) is not None]
    if wanted:
        unknown = set(wanted) - {g.name for g in GROUPS}
        if unknown:
            raise SystemExit(f"unknown groups: {', '.join(sorted(unknown))}")
        found = [g for g in found if g.name in wanted]
    return found


def _child_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["AVCC_DEV_MODE"] = "true"
    env["AVCC_DATA_DIR"] = str(settings.data_dir.resolve())
    env.setdefault("AVCC_KAFKA_URL", settings.kafka_url)
    return env


def run_dev_stack(wanted: list[str] | None = None, *, start_broker: bool = True, chain: str = "local") -> int:
    """Start everything, wait for Ctrl-C/SIGTERM, then stop everything. Returns an exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ["AVCC_DEV_MODE"] = "true"
    get_settings.cache_clear()
    settings = get_settings()
    settings.check_bind()
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    broker: TansuBroker | None = None
    dev_chain: DevChain | None = None
    children: list[tuple[GroupSpec, subprocess.Popen[bytes]]] = []
    stopping = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        if start_broker:
            port = int(settings.kafka_bootstrap.split(",")[0].rsplit(":", 1)[1])
            broker = TansuBroker(data_dir / "tansu", port=port)
            broker.start()
            log.info("embedded Tansu broker on %s", broker.bootstrap)
        if chain == "evm":
            dev_chain = start_dev_chain(data_dir, dev_chain_port(settings))
            log.info("ganache dev chain on %s, AvccRegistry at %s", dev_chain.node.url, dev_chain.env)
        report = apply_plan(settings)
        for name in report.created:
            log.info("created topic %s", name)
        for drift in report.unfixed:
            log.error("topic drift: %s", drift.line())
        groups = available_groups(wanted)
        logs = data_dir / "logs"
        logs.mkdir(exist_ok=True)
        env = {**_child_env(settings), **(dev_chain.env if dev_chain else {})}
        for group in groups:
            child = _start_group(group, env, logs)
            children.append((group, child))
            log.info(
                "started group %s (pid %d, web port %d, log %s)",
                group.name,
                child.pid,
                settings.web_port + group.port_offset,
                logs / f"{group.name}.log",
            )
        print(
            BANNER.format(
                bootstrap=settings.kafka_bootstrap,
                clickhouse=redact_url(settings.clickhouse_url),
                chain=redact_url(env.get("AVCC_CHAIN_URL", settings.chain_url)),
                host=settings.web_host,
                port=settings.web_port,
                code_port=settings.web_port + 1,
            ),
            flush=True,
        )
        restarts: dict[str, list[float]] = {}
        while not stopping:
            for n, (group, child) in enumerate(children):
                if child.poll() is None:
                    continue
                recent = [t for t in restarts.get(group.name, []) if time.monotonic() - t < RESTART_WINDOW_S]
                if len(recent) >= MAX_RESTARTS:
                    log.error(
                        "group %s keeps exiting (last status %s); stopping the stack",
                        group.name,
                        child.returncode,
                    )
                    stopping = True
                    break
                log.warning("group %s exited with %s; restarting it", group.name, child.returncode)
                restarts[group.name] = [*recent, time.monotonic()]
                children[n] = (group, _start_group(group, env, logs))
            time.sleep(0.5)
        return 0
    finally:
        _stop_children(children)
        if broker is not None:
            broker.stop()
        if dev_chain is not None:
            dev_chain.stop()
        log.info("dev stack stopped")


def _start_group(group: GroupSpec, env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    """Start one group's worker, logging to ``logs/GROUP.log``."""
    out = (logs / f"{group.name}.log").open("ab")
    cmd = [sys.executable, "-m", "app", "worker", group.name]
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=Path.cwd())


def _stop_children(children: list[tuple[GroupSpec, subprocess.Popen[bytes]]]) -> None:
    for _, child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    for group, child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("group %s ignored SIGTERM; killing it", group.name)
            child.kill()
            child.wait()
