"""The dev stack's supervisor (issue 10): a taken port fails `avcc dev` fast and by name; a worker
that aborts (SIGABRT, like librdkafka's failed assertion) or is killed over and over comes back
after growing delays while the rest of the stack keeps serving, and no application is lost.
(The broker's own restarts: tests/integration/test_dev_restarts.py.)"""

from __future__ import annotations

import ast
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from app.platform.groups import GROUPS, group_spec
from app.platform.http.auth import sign_request
from testing.ports import free_port_block
from tests.integration.test_dev_stack import (
    ROOT,
    _application,
    _descendants,
    _get,
    _post,
    _wait_ready,
    assert_none_left,
    terminate,
)

DEV_KEY = ("dev", "dev-secret")
#: Enough for a record to be issued (code -> review -> chain -> code) plus the console's ops group.
SUPERVISED = ("code", "review", "chain", "ops")
#: The supervisor's line for each exit of a worker: group, cause, the delay it chose.
EXIT_LINE = re.compile(
    r"group (\w+) (?:exited \((.*?)\) after|is crash-looping \(CrashLoopBackOff\): \d+ exits in a row, "
    r"the last (.*?) after) [\d.]+s; restart #\d+ in ([\d.]+)s"
)
#: How the supervisor names an exit of the stall watchdog (a worker that stopped itself on a
#: loaded box): the only exit the test did not cause that is allowed.
STALLED = "the worker stopped itself: stalled partitions"


def _exits(text: str) -> list[tuple[str, str, float]]:
    """``(group, cause, restart delay)`` of every exit the supervisor logged, in order."""
    return [(g, cause_a or cause_b, float(delay)) for g, cause_a, cause_b, delay in EXIT_LINE.findall(text)]


def _dev_env(tmp_path: Path, broker_port: int, web_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
    env.update(
        {
            "AVCC_KAFKA_URL": f"kafka://127.0.0.1:{broker_port}",
            "AVCC_WEB_PORT": str(web_port),
            "AVCC_DATA_DIR": str(tmp_path / "var"),
            "AVCC_DEV_RESTART_INITIAL_S": "1",
            "AVCC_DEV_RESTART_MAX_S": "8",
            "AVCC_DEV_RESTART_STABLE_S": "60",
            "AVCC_DEV_CRASH_LOOP_RESTARTS": "3",
        }
    )
    return env


def _no_core_dumps() -> None:
    """An aborted worker must not drop a core file into the checkout."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def test_avcc_dev_refuses_a_plan_with_the_controller_on_a_web_port_before_anything_starts(
    tmp_path: Path,
) -> None:
    """The broker just below AVCC_WEB_PORT would put its KRaft controller (the broker's port + 1)
    on the ops group's web port: refused at once, naming both listeners, nothing started."""
    base = free_port_block([-1, *(g.port_offset for g in GROUPS)])
    done = subprocess.run(
        [sys.executable, "-m", "app", "dev"],
        cwd=ROOT,
        env=_dev_env(tmp_path, base - 1, base),
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert f"port {base} is planned for both the embedded Kafka broker's KRaft controller" in output, output
    assert "the web server of group ops" in output, output
    assert not (tmp_path / "var" / "kafka").exists(), "nothing starts before the plan is checked"


@pytest.mark.parametrize("taken", ["broker", "code web"])
def test_avcc_dev_with_a_taken_port_exits_within_seconds_naming_the_port(tmp_path: Path, taken: str) -> None:
    base = free_port_block(g.port_offset for g in GROUPS)
    broker_port = free_port_block((0, 1))  # the broker and its KRaft controller
    port = broker_port if taken == "broker" else base + group_spec("code").port_offset
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "app", "dev"],
            cwd=ROOT,
            env=_dev_env(tmp_path, broker_port, base),
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    # Fast because nothing starts first (no kafka dir below, no banner): that order is the
    # property; the time is only bounded by a generous deadline (a loaded box imports slowly).
    assert took < 60, f"took {took:.1f}s to notice port {port} is taken"
    assert f"port {port} is already in use on 127.0.0.1" in output, output
    assert f"held by pid {os.getpid()} (" in output, output  # the squatter is this very test
    assert "AVCC dev stack" not in output, "no banner over a stack that did not start"
    assert not (tmp_path / "var" / "kafka").exists(), "nothing may start before the ports are checked"


def _worker_pid(dev_pid: int, group: str) -> int | None:
    """PID of the running ``avcc worker GROUP`` process under the dev stack."""
    for pid in _descendants(dev_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv[-3:-1] == [b"worker", group.encode()] and state != "Z":
            return pid
    return None


def _wait_new_pid(dev: subprocess.Popen[bytes], group: str, old: int, timeout: float) -> tuple[int, float]:
    """Wait until ``group`` runs under a new PID; return it and the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        assert dev.poll() is None, "the dev stack stopped"
        pid = _worker_pid(dev.pid, group)
        if pid is not None and pid != old:
            return pid, time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"group {group} was not restarted within {timeout:.0f}s")


def _apply(code_url: str) -> int:
    body = _application("supervised")
    path = "/v1/avcc/applications"
    status, answer = _post(code_url + path, body, sign_request("POST", path, body, *DEV_KEY))
    assert status == 202, answer
    return int(orjson.loads(answer)["avcc_record_id"])


def _codes(code_url: str, records: list[int], timeout: float) -> dict[int, str]:
    """Each record's AVCC code, waiting until every one is issued."""
    codes: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while len(codes) < len(records) and time.monotonic() < deadline:
        for record in records:
            if record in codes:
                continue
            path = f"/v1/avcc/records/{record}"
            try:
                status, raw = _get(code_url + path, sign_request("GET", path, b"", *DEV_KEY))
            except OSError:
                continue
            if status == 200 and orjson.loads(raw).get("avcc_code"):
                codes[record] = orjson.loads(raw)["avcc_code"]
        time.sleep(1)
    assert len(codes) == len(records), f"not issued: {sorted(set(records) - set(codes))}"
    return codes


@pytest.mark.slow
def test_aborted_and_crash_looping_workers_come_back_with_growing_delays_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    base = free_port_block(g.port_offset for g in GROUPS)
    log = tmp_path / "dev.log"
    dev = subprocess.Popen(
        [sys.executable, "-m", "app", "dev", "--groups", ",".join(SUPERVISED)],
        cwd=ROOT,
        env=_dev_env(tmp_path, free_port_block((0, 1)), base),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_no_core_dumps,
    )
    ports = {name: base + group_spec(name).port_offset for name in SUPERVISED}
    code_url = f"http://127.0.0.1:{ports['code']}"
    try:
        _wait_ready(dev, ports, 300, log)
        first = {name: _worker_pid(dev.pid, name) for name in SUPERVISED}
        assert all(first.values()), first

        # applications in flight while review aborts, then keeps dying as soon as it is back
        records = [_apply(code_url) for _ in range(5)]
        os.kill(int(first["review"] or 0), signal.SIGABRT)
        pid, waited = _wait_new_pid(dev, "review", int(first["review"] or 0), 60)
        waits = [waited]
        for _ in range(3):
            os.kill(pid, signal.SIGKILL)
            old = pid
            pid, waited = _wait_new_pid(dev, "review", old, 60)
            waits.append(waited)
        text = log.read_text()
        exits = _exits(text)
        caused = [(cause, delay) for g, cause, delay in exits if g == "review" and STALLED not in cause]
        delays = [delay for _cause, delay in caused]
        assert delays == [1.0, 2.0, 4.0, 8.0], text[-3000:]
        assert "group review exited (killed by SIGABRT (a native abort" in text
        assert "group review is crash-looping (CrashLoopBackOff): 3 exits in a row" in text
        for expected, waited in zip(delays, waits, strict=True):
            assert expected - 0.2 <= waited < expected + 30, (delays, waits)
        assert delays == sorted(set(delays)), f"restart delays must grow: {delays}"
        assert dev.poll() is None, "one group crash-looping must not stop the stack"
        for name in ("code", "chain", "ops"):
            # untouched by review's crashes; only its own stall watchdog may have restarted it
            own = [cause for g, cause, _delay in exits if g == name]
            assert all(STALLED in cause for cause in own), f"{name} was disturbed by review's crashes: {own}"
            if not own:
                assert _worker_pid(dev.pid, name) == first[name], f"{name} was disturbed by review's crashes"

        # the ops worker aborting (the librdkafka assertion of issue 10) is survived the same way
        os.kill(int(first["ops"] or 0), signal.SIGABRT)
        _wait_new_pid(dev, "ops", int(first["ops"] or 0), 60)
        assert "group ops exited (killed by SIGABRT" in log.read_text()

        _wait_ready(dev, ports, 300, log)
        records.append(_apply(code_url))
        codes = _codes(code_url, records, 240)
        assert len(set(codes.values())) == len(records), f"a code issued twice: {codes}"
    finally:
        children = terminate(dev)
    assert dev.returncode == 0, log.read_text()[-3000:]
    assert_none_left(children)
    # every restart counted: the 4 of review and the 1 of ops the test caused, plus any the
    # stall watchdog made (checked above to be the only others)
    text = log.read_text()
    exits = _exits(text)
    assert [cause for g, cause, _d in exits if g == "ops" and STALLED not in cause] == [
        "killed by SIGABRT (a native abort, e.g. a failed librdkafka assertion)"
    ]
    assert all(STALLED in cause for g, cause, _d in exits if g not in ("review", "ops")), exits
    summary = re.search(r"restarts while the stack ran: (\{.*\})", text)
    assert summary, text[-3000:]
    assert ast.literal_eval(summary.group(1)) == dict(Counter(g for g, _cause, _d in exits)), text[-3000:]
