"""`avcc dev` on its own data: the whole stack, stopped with Ctrl-C and started again (twice), still
serves the records it issued before; a SIGKILLed broker comes back by itself on its data and the
groups recover; a SIGKILLed `avcc dev` takes its broker and groups with it; a broker whose data
was wiped under kept tables is refused with what to delete, before any worker starts (no crash
loop).

One stack story in one test, as starting the stack is what costs here (about 40 s on 2 cores).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from app.platform.groups import GROUPS
from app.platform.http.auth import sign_request
from app.supervisor.broker_identity import CLUSTER_ID_FILE
from app.supervisor.ports import port_holders
from testing.ports import free_port_block
from tests.integration.test_dev_stack import (
    ROOT,
    _application,
    _descendants,
    _get,
    _post,
    _wait_ready,
    assert_none_left,
)
from tests.processes import alive

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

DEV_KEY = ("dev", "dev-secret")
#: How the supervisor reports the broker's exit and its return (app/supervisor/broker.py).
BROKER_EXIT = re.compile(
    r"embedded Kafka broker on 127\.0\.0\.1:(\d+) exited \(killed by SIGKILL\) after [\d.]+s; "
    r"restart #1 in 1\.0s on its data in (\S+)"
)
BROKER_BACK = re.compile(r"embedded Kafka broker back on 127\.0\.0\.1:\d+ after ([\d.]+)s \(restart #1\)")
READY_IN = re.compile(r"embedded Apache Kafka 3\.9\.1 \(KRaft\) on \S+, ready in ([\d.]+)s on (\w+) Java")


class DevStack:
    """``avcc dev`` runs on fixed ports and one data dir, started and stopped like a developer does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.web_port = free_port_block(g.port_offset for g in GROUPS)
        self.broker_port = free_port_block((0, 1))  # the broker and its KRaft controller
        self.ports = {g.name: self.web_port + g.port_offset for g in GROUPS}
        self.code_url = f"http://127.0.0.1:{self.ports['code']}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
        self.env.update(
            AVCC_KAFKA_URL=f"kafka://127.0.0.1:{self.broker_port}",
            AVCC_WEB_PORT=str(self.web_port),
            AVCC_DATA_DIR=str(root / "var"),
            AVCC_DEV_RESTART_INITIAL_S="1",
        )
        self.runs = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.root / f"dev-{self.runs}.log"

    def start(self) -> subprocess.Popen[bytes]:
        self.runs += 1
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app", "dev"],
            cwd=ROOT,
            env=self.env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self.process

    def start_ready(self) -> float:
        """Start the stack and wait until every group answers ``/ready``; seconds it took."""
        started = time.monotonic()
        _wait_ready(self.start(), self.ports, 300, self.log)
        return time.monotonic() - started

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to ``avcc dev`` alone; it stops everything it started and exits 0."""
        assert self.process is not None
        children = _descendants(self.process.pid)
        self.process.send_signal(signal.SIGINT)
        try:
            assert self.process.wait(timeout=90) == 0, self.log.read_text()[-3000:]
        finally:
            self.kill()
        assert_none_left(children)

    def kill_alone(self) -> None:
        """SIGKILL ``avcc dev`` alone (an OOM kill, a closed terminal): its broker and its groups
        go with it, and every port of the stack is free again."""
        assert self.process is not None
        children = _descendants(self.process.pid)
        assert self.broker_pid() in children
        self.process.kill()
        self.process.wait()
        deadline = time.monotonic() + 120
        while (left := {pid for pid in children if alive(pid)}) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"processes that outlived their SIGKILLed avcc dev: {left}"
        ports = [self.broker_port, *self.ports.values()]
        assert not {port: holders for port in ports if (holders := port_holders(port))}

    def kill(self) -> None:
        """SIGKILL whatever is left of the stack's process group (cleanup after a failure)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def broker_pid(self) -> int:
        """The stack's own broker: the one process listening on the broker port."""
        assert self.process is not None
        holders = port_holders(self.broker_port)
        assert len(holders) == 1 and set(holders.values()) == {"java"}, holders
        (pid,) = holders
        assert pid in _descendants(self.process.pid), "the broker on the port must be the stack's own"
        return pid

    def apply(self, title: str) -> int:
        body = _application(title)
        path = "/v1/avcc/applications"
        status, answer = _post(self.code_url + path, body, sign_request("POST", path, body, *DEV_KEY))
        assert status == 202, answer
        return int(orjson.loads(answer)["avcc_record_id"])

    def record(self, record_id: int, *, timeout: float = 180.0) -> dict[str, object]:
        """The record once it has its AVCC code (any answer without one is waited out)."""
        path = f"/v1/avcc/records/{record_id}"
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                status, raw = _get(self.code_url + path, sign_request("GET", path, b"", *DEV_KEY))
            except OSError as exc:
                last = exc
            else:
                last = (status, raw[:300])
                if status == 200 and orjson.loads(raw).get("avcc_code"):
                    record: dict[str, object] = orjson.loads(raw)
                    return record
            time.sleep(1)
        raise AssertionError(f"record {record_id} not served with a code within {timeout:.0f}s: {last}")


def test_the_dev_stack_keeps_its_records_through_broker_kills_and_restarts(tmp_path: Path) -> None:
    stack = DevStack(tmp_path)
    kafka_dir = tmp_path / "var" / "kafka"
    try:
        # -- run 1: a fresh stack issues a code; its broker is SIGKILLed and comes back on its data
        first_ready = stack.start_ready()
        text = stack.log.read_text()
        assert READY_IN.search(text), text[-3000:]
        first = stack.apply("before any restart")
        issued = {first: stack.record(first)["avcc_code"]}
        cluster_id = (tmp_path / "var" / "workers" / CLUSTER_ID_FILE).read_text().strip()

        killed = stack.broker_pid()
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not BROKER_BACK.search(stack.log.read_text()) and time.monotonic() < deadline:
            assert stack.process is not None and stack.process.poll() is None, "the stack must not stop"
            time.sleep(0.5)
        text = stack.log.read_text()
        exited, back = BROKER_EXIT.search(text), BROKER_BACK.search(text)
        assert exited and back, text[-3000:]
        assert int(exited.group(1)) == stack.broker_port and Path(exited.group(2)) == kafka_dir
        assert stack.broker_pid() != killed
        _wait_ready(stack.process, stack.ports, 300, stack.log)  # the groups recover
        assert stack.record(first)["avcc_code"] == issued[first]
        after_kill = stack.apply("after the broker was killed")
        issued[after_kill] = stack.record(after_kill)["avcc_code"]
        stack.interrupt()
        assert "broker restarts while the stack ran: 1" in stack.log.read_text()

        # -- runs 2 and 3: start again; every record is still there, each run adds one; run 2 ends
        # with Ctrl-C, run 3 with a SIGKILL of avcc dev alone, which leaves nothing behind
        restarted_ready: list[float] = []
        for run, stop in ((2, stack.interrupt), (3, stack.kill_alone)):
            restarted_ready.append(stack.start_ready())
            for record_id, code in issued.items():
                assert stack.record(record_id, timeout=60)["avcc_code"] == code, (run, record_id)
            added = stack.apply(f"in run {run}")
            issued[added] = stack.record(added)["avcc_code"]
            assert "cannot start" not in stack.log.read_text()
            stop()
        assert (tmp_path / "var" / "workers" / CLUSTER_ID_FILE).read_text().strip() == cluster_id
        assert len(set(issued.values())) == len(issued) == 4
        print(
            f"\navcc dev ready: first start {first_ready:.0f}s, restarts "
            f"{', '.join(f'{s:.0f}s' for s in restarted_ready)}; broker back after a SIGKILL in "
            f"{float(back.group(1)):.1f}s"
        )

        # -- run 4: the broker's data is wiped but the tables are kept: refused, saying what to do
        shutil.rmtree(kafka_dir)
        process = stack.start()
        assert process.wait(timeout=180) == 3, stack.log.read_text()[-3000:]
        text = stack.log.read_text()
        assert f"the workers' tables in {tmp_path / 'var' / 'workers'} were built on the broker" in text
        assert f"with cluster id {cluster_id}, but the broker now answers with cluster id" in text
        assert f"delete {tmp_path / 'var' / 'workers'}" in text and "make clean" in text
        assert "started group" not in text, "no worker may start on tables of another broker"
        assert "AVCC dev stack" not in text
        assert not port_holders(stack.broker_port), "the broker it started for the check is stopped"
    finally:
        stack.kill()
