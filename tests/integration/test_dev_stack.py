"""The README's run command and quick start: `avcc dev` brings up every group on the embedded
defaults, works, answers the quick start's commands as written, and stops without leaving a
process behind.

One `avcc dev` serves the module (started with the quick start's first line, run literally);
stopping it cleanly is checked when the module ends (a failure there is reported as an error in
the teardown of the module's last test).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from app.platform.groups import GROUPS
from app.platform.http.auth import sign_request
from testing.ports import free_port_block

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _descendants(pid: int) -> set[int]:
    """PIDs whose parent chain leads to ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _listening(pids: set[int]) -> set[tuple[str, int]]:
    """``(address, port)`` of every TCP socket in LISTEN state held by one of ``pids``."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found: set[tuple[str, int]] = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            raw_ip, raw_port = local.split(":")
            packed = bytes.fromhex(raw_ip)
            # /proc prints each 32-bit word in host (little-endian) order
            ip_bytes = b"".join(packed[i : i + 4][::-1] for i in range(0, width, 4))
            found.add((str(ipaddress.ip_address(ip_bytes)), int(raw_port, 16)))
    return found


def _port_plan(log: str) -> dict[int, str]:
    """The port plan the stack's banner names: port -> what listens there."""
    section = log.split(" Ports (the stack's port plan", 1)[1].split("=====", 1)[0]
    found = re.findall(r"^\s+[\d.]+:(\d+)\s+(.+?)\s*$", section, re.M)
    return {int(port): purpose for port, purpose in found}


def _loopback(ip: str) -> bool:
    """Whether ``ip`` is a loopback address, also written IPv4-mapped (``::ffff:127.0.0.1``: how the
    JVM's dual-stack sockets, the Kafka broker's, show up in ``/proc/net/tcp6``)."""
    address = ipaddress.ip_address(ip)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def _wait_ready(dev: subprocess.Popen[bytes], ports: dict[str, int], timeout: float, log: Path) -> None:
    """Wait until every group answers ``/ready`` on its port (failing with the end of ``log``)."""
    deadline = time.monotonic() + timeout
    pending = dict(ports)
    while pending and time.monotonic() < deadline:
        assert dev.poll() is None, log.read_text()[-3000:]
        for name, port in list(pending.items()):
            try:
                if _get(f"http://127.0.0.1:{port}/ready")[0] == 200:
                    del pending[name]
            except OSError:
                pass
        time.sleep(1)
    assert not pending, f"groups not ready: {sorted(pending)}\n{log.read_text()[-3000:]}"


def _application(title: str) -> bytes:
    """A fresh, valid application body (new request id and content hash each call)."""
    return orjson.dumps(
        {
            "request_id": f"req_{uuid.uuid4().hex[:10]}",
            "content_url": "s3://aigc-hub-storage/w/a.mp4",
            "content_hash": "sha256:" + hashlib.sha256(uuid.uuid4().bytes).hexdigest(),
            "ai_tool_info": {"model_name": "Stable-Diffusion-XL", "model_version": "v1.0"},
            "priority": 9,
            "title": title,
            "applicant_id": "dev-user",
        }
    )


@dataclass
class DevStack:
    """The module's running `avcc dev`: its process, ports, environment and log."""

    process: subprocess.Popen[bytes]
    base: int
    broker_port: int
    env: dict[str, str]
    cwd: Path
    log: Path


def quickstart_commands(readme: str) -> list[str]:
    """The command lines of the README's ``## Quick start`` bash block (comment lines left out)."""
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found, "the Quick start section has no bash block"
    return [
        line for line in found.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


@pytest.fixture(scope="module")
def dev_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    """`avcc dev` as the quick start's first line says, with free ports, a temporary data dir,
    this checkout on the path and a playback partner's key beside the dev key; stopped at the
    end of the module, where it must exit 0 and leave no process behind."""
    commands = quickstart_commands((ROOT / "README.md").read_text())
    assert commands[0].split("#")[0].split() == ["avcc", "dev"], commands
    cwd = tmp_path_factory.mktemp("dev-stack")
    base = free_port_block(g.port_offset for g in GROUPS)
    broker_port = free_port_block((0, 1))  # the broker and its KRaft controller
    env = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
    env.update(
        {
            "AVCC_KAFKA_URL": f"kafka://127.0.0.1:{broker_port}",
            "AVCC_WEB_PORT": str(base),
            "AVCC_DATA_DIR": str(cwd / "var"),
            # a playback partner's key beside the dev key: it may only post and read playback
            "AVCC_HMAC_KEYS": orjson.dumps(
                {PARTNER: {"secret": PARTNER_SECRET, "scopes": PARTNER_SCOPES}}
            ).decode(),
            "PYTHONPATH": str(ROOT),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    log = cwd / "dev.log"
    dev = subprocess.Popen(
        ["bash", "-c", f"exec {commands[0]}"],
        cwd=cwd,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_ready(dev, {g.name: base + g.port_offset for g in GROUPS}, 240, log)
        yield DevStack(dev, base, broker_port, env, cwd, log)
    finally:
        children = terminate(dev)
    assert dev.returncode == 0, log.read_text()[-3000:]
    assert_none_left(children)


def test_avcc_dev_runs_every_group(dev_stack: DevStack) -> None:
    dev, base, broker_port, log = dev_stack.process, dev_stack.base, dev_stack.broker_port, dev_stack.log
    assert "dev-secret" in log.read_text(), "the dev key must be announced loudly"

    stack = _descendants(dev.pid) | {dev.pid}
    sockets = _listening(stack)
    ports = {port for _, port in sockets}
    plan = _port_plan(log.read_text())
    assert plan == {
        broker_port: "the embedded Kafka broker",
        broker_port + 1: "the embedded Kafka broker's KRaft controller",
        **{base + g.port_offset: f"the web server of group {g.name}" for g in GROUPS},
    }, plan
    assert ports == set(plan), f"listeners outside the port plan: {sorted(ports - set(plan))}"
    exposed = {(ip, port) for ip, port in sockets if not _loopback(ip)}
    assert not exposed, f"the dev stack listens beyond loopback: {sorted(exposed)}"
    for group in GROUPS:  # faust's own table/router views answer without any login: gone
        for page in ("/router/", "/table/records/1/", "/table/claims/x/"):
            assert _get(f"http://127.0.0.1:{base + group.port_offset}{page}")[0] in (401, 404)

    body = _application("dev stack")
    path = "/v1/avcc/applications"
    code_url = f"http://127.0.0.1:{base + 1}"
    status, answer = _post(code_url + path, body, sign_request("POST", path, body, "dev", "dev-secret"))
    assert status == 202, answer
    record_path = f"/v1/avcc/records/{orjson.loads(answer)['avcc_record_id']}"
    deadline = time.monotonic() + 120
    while True:
        status, raw = _get(code_url + record_path, sign_request("GET", record_path, b"", "dev", "dev-secret"))
        if status == 200 and orjson.loads(raw).get("avcc_code"):
            break
        assert time.monotonic() < deadline, f"no code issued in the dev stack: {status} {raw!r}"
        time.sleep(0.5)
    assert _get(f"http://127.0.0.1:{base}/dlq")[0] == 401
    _check_operator_pages(base, orjson.loads(raw)["avcc_record_id"])
    _check_partner_scopes(base, record_path, body)


MARKER = "@@@quickstart"


def test_readme_quickstart_commands_work_as_written(dev_stack: DevStack) -> None:
    """The README's quick start, run literally: its commands are read from README.md, not copied
    here. ``avcc dev`` (its "terminal 1") is the module's stack; the others run in one bash
    session, as typed into "terminal 2", with a marker after each so every answer is checked on
    its own. Only the environment differs from a fresh shell: free ports (``AVCC_WEB_PORT``,
    ``AVCC_KAFKA_URL``), a temporary data dir and this checkout on the path."""
    session = quickstart_commands((ROOT / "README.md").read_text())[1:]
    assert len(session) == 5, f"the checks below follow the README's five commands: {session}"
    script = "set -euo pipefail\n" + "".join(
        f"{command}\nprintf '\\n{MARKER} {i}\\n'\n" for i, command in enumerate(session)
    )
    run = subprocess.run(
        ["bash", "-c", script],
        cwd=dev_stack.cwd,
        env=dev_stack.env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{dev_stack.log.read_text()[-3000:]}"
    answers = [part.strip() for part in re.split(rf"\n?{MARKER} \d+\n", run.stdout)][: len(session)]

    assert answers[0] == ""  # PORT=...
    ready = orjson.loads(answers[1])
    assert ready["group"] == "code" and ready["status"] == "ready", ready
    applied = re.fullmatch(r"record (\d+)", answers[2])
    assert applied, answers[2]
    record = orjson.loads(answers[3])
    assert record["avcc_record_id"] == int(applied.group(1))
    assert record["status"] == "issued" and re.fullmatch(r"MA\.156\.\d+\.\d+/\S+", record["avcc_code"])
    assert [h["status"] for h in record["history"]][-1] == "issued", record["history"]
    assert answers[4] == "<h1>Pipeline overview</h1>"


def terminate(dev: subprocess.Popen[bytes]) -> set[int]:
    """SIGTERM ``avcc dev`` and wait for it (SIGKILL its group after 60 s); its children's PIDs."""
    children = _descendants(dev.pid)
    dev.send_signal(signal.SIGTERM)
    try:
        dev.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(dev.pid, signal.SIGKILL)
        raise
    return children


def assert_none_left(children: set[int]) -> None:
    """No process the dev stack started outlives it."""
    time.sleep(1)
    left = {pid for pid in children if Path(f"/proc/{pid}").exists()}
    assert not left, f"processes left behind after SIGTERM: {left}"


PARTNER = "partner-a"
PARTNER_SECRET = "s3cret-partner-a-000"
PARTNER_SCOPES = ["playback:write", "playback:read"]


def _check_partner_scopes(base: int, record_path: str, application: bytes) -> None:
    """A key scoped to playback posts events (202) and reads stats (200), and is refused 403
    (naming the scope) on a review decision, an application and a record."""

    def signed(method: str, path: str, body: bytes = b"") -> dict[str, str]:
        return sign_request(method, path, body, PARTNER, PARTNER_SECRET)

    events = orjson.dumps(
        [
            {
                "avcc_code": "MA.156.10005.8361/AV00000001",
                "platform_node": "8361",
                "user_hash": "sha256:" + hashlib.sha256(b"viewer").hexdigest(),
                "event_type": "play",
                "duration_sec": 30,
                "revenue_cny": "0.00",
            }
        ]
    )
    path = "/v1/playback/events"
    gateway = f"http://127.0.0.1:{base + 5}"
    status, answer = _post(
        gateway + path, events, {**signed("POST", path, events), "Content-Type": "application/json"}
    )
    assert status == 202 and orjson.loads(answer)["accepted"] == 1, answer
    stats = "/v1/playback/stats?avcc_code=MA.156.10005.8361/AV00000001"
    status, answer = _get(f"http://127.0.0.1:{base + 6}{stats}", signed("GET", stats))
    assert status == 200, answer
    decision = orjson.dumps({"decision": "approve", "final_level": "A", "reviewer": "mallory", "reason": "x"})
    decide = "/v1/review/tasks/1/decision"
    refused = [
        _post(f"http://127.0.0.1:{base + 2}{decide}", decision, signed("POST", decide, decision)),
        _post(
            f"http://127.0.0.1:{base + 1}/v1/avcc/applications",
            application,
            signed("POST", "/v1/avcc/applications", application),
        ),
        _get(f"http://127.0.0.1:{base + 1}{record_path}", signed("GET", record_path)),
    ]
    for (status, answer), scope in zip(refused, ("review:decide", "apply", "records:read"), strict=True):
        assert status == 403, (scope, status, answer)
        assert orjson.loads(answer) == {
            "error": f"this key may not use this route; it needs the scope {scope!r}",
            "reason": "scope",
            "required": scope,
        }


def _check_operator_pages(base: int, record_id: int) -> None:
    """Operator pages answer 401 (never data) without a login and 200 with the dev login;
    probes stay open; every answer forbids framing."""
    admin = {"Authorization": "Basic " + base64.b64encode(b"admin:admin").decode()}
    wrong = {"Authorization": "Basic " + base64.b64encode(b"admin:nope").decode()}
    pages = {
        f"http://127.0.0.1:{base + 1}/records": f"<td>{record_id}</td>".encode(),
        f"http://127.0.0.1:{base}/lag": b"<h1>Consumer lag</h1>",
        f"http://127.0.0.1:{base}/lag.json": b"taken_at",
        f"http://127.0.0.1:{base}/dlq.json": b"items",
    }
    for url, marker in pages.items():
        status, body = _get(url)
        assert status == 401 and marker not in body, (url, status, body[:200])
        assert _get(url, wrong)[0] == 401, url
        status, body = _get(url, admin)
        assert status == 200 and marker in body, (url, status, body[:200])
    for group in GROUPS:
        port = base + group.port_offset
        assert _get(f"http://127.0.0.1:{port}/")[0] == 401  # faust's index page too
        status, body = _get(f"http://127.0.0.1:{port}/ready")
        assert status == 200 and orjson.loads(body)["status"] == "ready"
        headers = _headers(f"http://127.0.0.1:{port}/health")
        assert headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]


def _headers(url: str) -> dict[str, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return dict(response.headers.items())
