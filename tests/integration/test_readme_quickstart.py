"""The README's quick start, run literally: its commands are read from README.md, not copied here.

The first command (``avcc dev``) is started in the background like the README's "terminal 1";
the others run in one bash session, as typed into "terminal 2", with a marker after each so
every answer is checked on its own. Only the environment differs from a fresh shell: free ports
(``AVCC_WEB_PORT``, ``AVCC_KAFKA_URL``), a temporary data dir and this checkout on the path.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from app.platform.groups import GROUPS
from app.servers.process import free_port, free_port_block

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
MARKER = "@@@quickstart"


def quickstart_commands(readme: str) -> list[str]:
    """The command lines of the README's ``## Quick start`` bash block (comment lines left out)."""
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found, "the Quick start section has no bash block"
    return [
        line for line in found.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def test_readme_quickstart_commands_work_as_written(tmp_path: Path) -> None:
    commands = quickstart_commands((ROOT / "README.md").read_text())
    assert commands[0].split("#")[0].split() == ["avcc", "dev"], commands
    session = commands[1:]
    assert len(session) == 5, f"the checks below follow the README's five commands: {session}"

    env = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
    env.update(
        AVCC_WEB_PORT=str(free_port_block(g.port_offset for g in GROUPS)),
        AVCC_KAFKA_URL=f"kafka://127.0.0.1:{free_port()}",
        AVCC_DATA_DIR=str(tmp_path / "var"),
        PYTHONPATH=str(ROOT),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    log = tmp_path / "dev.log"
    dev = subprocess.Popen(
        ["bash", "-c", f"exec {commands[0]}"],
        cwd=tmp_path,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        script = "set -euo pipefail\n" + "".join(
            f"{command}\nprintf '\\n{MARKER} {i}\\n'\n" for i, command in enumerate(session)
        )
        run = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=360
        )
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{log.read_text()[-3000:]}"
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
    finally:
        dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
            dev.wait(timeout=10)
