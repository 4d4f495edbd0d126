"""Runs agent-group workers as real subprocesses against a test broker, and signs requests."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from confluent_kafka.admin import AdminClient, NewTopic

from app.platform.http.auth import sign_request
from app.servers.process import ManagedProcess
from bench.client import Answer, call, settled
from bench.data import o_level_application
from testing.ports import free_port
from testing.processes import start_together, stop_together
from testing.workers import group_worker, worker_ready

__all__ = [
    "API_KEY",
    "API_SECRET",
    "CONSOLE_KEY",
    "CORE_GROUPS",
    "EXPECTED_EVENTS",
    "Stack",
    "application",
    "console_env",
    "create_topic",
    "issued_exactly_once",
    "record_when",
    "run_avcc",
    "wait_for",
]

CORE_GROUPS = ("code", "review", "chain", "settlement")

API_KEY = "test-partner"
API_SECRET = "test-secret-0123456789"
#: The key the console signs its calls to the other workers with (scoped, as in production).
CONSOLE_KEY = "console"
ROOT = Path(__file__).resolve().parents[2]


class Stack:
    """Worker processes of several groups sharing one broker, data under ``root``."""

    def __init__(
        self,
        bootstrap: str,
        root: Path,
        env: Mapping[str, str] | None = None,
        group_env: Mapping[str, Mapping[str, str]] | None = None,
        *,
        static_membership: bool = False,
    ) -> None:
        self.bootstrap = bootstrap
        #: Each worker a static group member named ``<group>-<index>``, as StatefulSet pods are.
        self.static_membership = static_membership
        #: Settings of one group's workers on top of ``env`` (e.g. each group's own Kafka login).
        self.group_env = {group: dict(values) for group, values in (group_env or {}).items()}
        self.root = root
        self.workers: dict[tuple[str, int], ManagedProcess] = {}
        self.ports: dict[tuple[str, int], int] = {}
        self.stopped: set[tuple[str, int]] = set()
        #: Workers SIGKILLed on purpose by :meth:`kill`, and every exit the supervisor restarted.
        self.killed: list[tuple[str, int]] = []
        self.exits: list[tuple[str, int, int]] = []
        self._supervising = threading.Event()
        base = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
        self.env: dict[str, str] = {
            **base,
            "AVCC_KAFKA_URL": f"kafka://{bootstrap}",
            "AVCC_HMAC_KEYS": json.dumps({API_KEY: API_SECRET}),
            "AVCC_OPERATOR_USERS": json.dumps({"operator": "operator-pass"}),
            "AVCC_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "AVCC_BLOCK_INTERVAL_MS": "50",
            "AVCC_LOG_LEVEL": "INFO",
            **(env or {}),
        }

    @staticmethod
    def host(index: int) -> str:
        """The loopback address replica ``index`` binds and announces (like one pod IP each)."""
        return f"127.0.0.{index + 1}"

    def worker(self, group: str, index: int = 0) -> ManagedProcess:
        """The (created on first use) worker process ``index`` of ``group``."""
        key = (group, index)
        if key not in self.workers:
            # every replica of a group listens on the same port, each on its own address (pods)
            port = next((p for (g, _), p in self.ports.items() if g == group), None) or free_port()
            member = {"AVCC_KAFKA_GROUP_INSTANCE_ID": f"{group}-{index}"} if self.static_membership else {}
            self.ports[key] = port
            self.workers[key] = group_worker(
                group,
                port=port,
                env={**self.env, **self.group_env.get(group, {}), **member},
                data_dir=self.root / f"{group}-{index}",
                log_path=self.root / f"{group}-{index}.log",
                host=self.host(index),
                name=f"{group}-{index}",
                cwd=ROOT,
                stop_timeout=30.0,
            )
        return self.workers[key]

    def start(self, *groups: str, index: int = 0, replicas: int = 1) -> None:
        """Start workers ``index`` .. ``index + replicas - 1`` of each group together and wait
        until each reports ``/ready``."""
        keys = [(group, i) for group in groups for i in range(index, index + replicas)]
        self.stopped.difference_update(keys)
        start_together(self.worker(group, i) for group, i in keys)

    def replicas(self, group: str) -> list[int]:
        """Indexes of the workers of ``group`` created so far."""
        return sorted(i for g, i in self.workers if g == group)

    def kill(self, group: str, index: int = 0) -> None:
        """SIGKILL a worker on purpose; the supervisor restarts it, as Kubernetes would a pod."""
        self.killed.append((group, index))
        self.worker(group, index).kill()

    def wait_all_ready(self, timeout: float = 150.0) -> None:
        """Wait until every running worker answers ``/ready`` (after another test restarted the
        broker or the supervisor restarted a worker)."""
        deadline = time.monotonic() + timeout
        for (group, index), process in self.workers.items():
            if (group, index) in self.stopped:
                continue
            while True:
                try:
                    if worker_ready(self.host(index), self.ports[(group, index)]):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"{group}-{index} not ready within {timeout}s\n{process.log_tail()}")
                time.sleep(0.5)

    def url(self, group: str, index: int = 0) -> str:
        """Base URL of a worker's web server."""
        return f"http://{self.host(index)}:{self.ports[(group, index)]}"

    def data_dir(self, group: str, index: int = 0) -> Path:
        """The worker's data dir (RocksDB tables, ledger)."""
        return self.root / f"{group}-{index}"

    def stop(self, group: str, index: int = 0) -> None:
        """Stop a worker on purpose (the supervisor leaves it stopped)."""
        self.stopped.add((group, index))
        self.worker(group, index).stop()

    def supervise(self) -> None:
        """Restart, like a supervisor would, every worker that exits without being stopped
        (crashes, SIGKILLs, the stall watchdog). Runs in a daemon thread until stop_all."""
        self._supervising.set()

        def loop() -> None:
            while self._supervising.is_set():
                for key, process in list(self.workers.items()):
                    code = process.returncode
                    if key not in self.stopped and code is not None:
                        self.exits.append((*key, code))
                        process.start(wait=False)
                time.sleep(1.0)

        threading.Thread(target=loop, name="stack-supervisor", daemon=True).start()

    def stop_all(self) -> None:
        """Stop every worker at once (SIGTERM, then SIGKILL after the stop timeout)."""
        self._supervising.clear()
        self.stopped.update(self.workers)
        stop_together(self.workers.values())

    def logs(self, groups: Iterable[str] | None = None) -> str:
        """Tails of worker logs, for assertion messages."""
        return "\n".join(
            p.log_tail(4000) for (g, _), p in self.workers.items() if groups is None or g in groups
        )

    async def call(
        self,
        group: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        signed: bool = True,
        headers: Mapping[str, str] | None = None,
        raw: bytes | None = None,
        index: int = 0,
    ) -> tuple[int, Any]:
        """One HTTP request to a worker; returns (status, decoded JSON or text). ``headers``
        replace the fresh signature's (e.g. to send one signed request twice)."""
        data = raw if raw is not None else _json(body)
        answer = await self._send(group, index, method, path, data, signed, headers or {})
        return answer.status, answer.body

    async def call_settled(
        self, group: str, method: str, path: str, body: Any = None, *, wait_s: float = 60.0, index: int = 0
    ) -> tuple[int, Any]:
        """:meth:`call`, sent again (freshly signed) after each ``503`` once its ``Retry-After``
        is over, for as long as ``wait_s`` allows (:func:`bench.client.settled`), like a client
        while the group rebalances (e.g. after a replica of an earlier test stopped)."""
        data = _json(body)
        answer = await settled(lambda: self._send(group, index, method, path, data, True, {}), wait_s=wait_s)
        return answer.status, answer.body

    async def _send(
        self,
        group: str,
        index: int,
        method: str,
        path: str,
        data: bytes,
        signed: bool,
        headers: Mapping[str, str],
    ) -> Answer:
        all_headers = dict(sign_request(method, path, data, API_KEY, API_SECRET)) if signed else {}
        all_headers.update(headers)
        async with aiohttp.ClientSession() as session:
            return await call(session, method, self.url(group, index) + path, data, all_headers)


def _json(body: Any) -> bytes:
    return orjson.dumps(body) if body is not None else b""


def console_env(operator: str, password: str) -> dict[str, str]:
    """Settings of a stack whose console signs with :data:`CONSOLE_KEY` and lets ``operator`` in."""
    keys = {
        API_KEY: API_SECRET,
        CONSOLE_KEY: {
            "secret": "console-secret-0123456789",
            "scopes": ["review:decide", "records:read", "playback:read"],
        },
    }
    return {
        "AVCC_HMAC_KEYS": json.dumps(keys),
        "AVCC_OPERATOR_USERS": json.dumps({operator: password}),
        "AVCC_CONSOLE_KEY_ID": CONSOLE_KEY,
    }


def run_avcc(
    args: list[str], env: Mapping[str, str], timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``avcc ARGS`` in a fresh process with ``env`` as its only ``AVCC_*`` settings; its output."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        env={**base, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(predicate: Any, timeout: float, interval: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns a truthy value; that value, or AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def application(**overrides: Any) -> dict[str, Any]:
    """A valid application body for a fresh work."""
    body = o_level_application()
    body.update(
        request_id=f"req_{uuid.uuid4().hex[:12]}",
        content_url="s3://aigc-hub-storage/works/raw/clip.mp4",
        title="Sunrise over the river",
        applicant_id="applicant-42",
    )
    body.update(overrides)
    return body


async def record_when(
    stack: Stack, record_id: int, done: Any, wait_s: float = 60.0, index: int = 0
) -> dict[str, Any]:
    """Poll ``GET /v1/avcc/records/{id}`` (of code replica ``index``) until ``done(record)``."""
    deadline = time.monotonic() + wait_s
    last: Any = None
    while time.monotonic() < deadline:
        status, last = await stack.call("code", "GET", f"/v1/avcc/records/{record_id}", index=index)
        if status == 200 and done(last):
            return dict(last)
        await asyncio.sleep(0.2)
    raise AssertionError(f"record {record_id} never reached the state; last={last}\n{stack.logs()}")


#: Each lifecycle event applied exactly once (their arrival order may vary: a chain receipt can
#: overtake the review result, which reaches the code group through its repartition topic).
EXPECTED_EVENTS = ["apply.created", "chain.tx.confirmed", "review.task.finished"]


async def issued_exactly_once(stack: Stack, record_ids: list[int], index: int = 0) -> list[dict[str, Any]]:
    """Every record issued once (read from code replica ``index``): each lifecycle event applied
    once, one distinct code each."""
    records = [
        await record_when(stack, r, lambda x: x.get("avcc_code"), wait_s=120, index=index) for r in record_ids
    ]
    for record in records:
        events = sorted(h["event"] for h in record["history"])
        assert events == EXPECTED_EVENTS, f"record {record['avcc_record_id']} history {record['history']}"
        assert record["status"] == "issued" and record["decision"] == "approved"
        assert record["history"][-1]["status"] == "issued"
    assert len({r["avcc_code"] for r in records}) == len(records)
    return records


def create_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    """Create ``topic`` and wait until every partition has a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, num_partitions=partitions, replication_factor=1)
    admin.create_topics([new], operation_timeout=30)[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {topic} has no leaders after 30s")
