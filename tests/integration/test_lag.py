"""Lag monitor and worker views on real brokers: alerts fire and resolve, STALL/STOP, /metrics of workers."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, Producer

from app.ops.alerts import Alert
from app.ops.lag.monitor import LagMonitor, LagReport
from app.ops.lag.settings import LagRule, LagSettings
from app.platform.kafka.admin import apply_plan
from app.platform.lag.reader import OffsetReader
from app.platform.metrics import REGISTRY
from app.platform.settings import Settings
from app.platform.topics import DLQ
from app.servers import KafkaKRaftBroker, ManagedProcess
from testing.ports import free_port
from tests.integration.faust_worker import worker_process
from tests.integration.stack import create_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


# ----------------------------------------------------------------------------- helpers


def produce(bootstrap: str, topic: str, count: int) -> None:
    """``count`` small records keyed round-robin, batched."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    failures: list[object] = []

    def on_delivery(err: object, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=b'{"n": %d}' % i, on_delivery=on_delivery)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    assert failures == []


def consumer_for(bootstrap: str, group: str, topic: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
        }
    )
    consumer.subscribe([topic])
    return consumer


def consume(consumer: Consumer, count: int, timeout_s: float = 90.0) -> int:
    got = 0
    deadline = time.monotonic() + timeout_s
    while got < count and time.monotonic() < deadline:
        for message in consumer.consume(num_messages=min(500, count - got), timeout=1.0):
            if message.error() is None:
                got += 1
    return got


class RecordingSink:
    """An alert sink that keeps what it was sent."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def send(self, alerts: Sequence[Alert]) -> None:
        self.alerts.extend(alerts)

    async def close(self) -> None:
        pass

    def statuses(self) -> list[str]:
        return [a.annotations["status"] for a in self.alerts]


def lag_config(topic: str, group: str, *, window_s: float = 60.0) -> LagSettings:
    rule = LagRule(
        name="TestApplyLag",
        topic=topic,
        groups=(group,),
        max_lag=1000,
        not_shrinking_s=60.0,
        action="scale out",
        scale_group="review",
    )
    return LagSettings(
        rules=(rule,),
        interval_s=1.0,
        window_s=window_s,
        repeat_s=600.0,
        group_prefix=group,
    )


async def tick_until(
    monitor: LagMonitor, condition: Callable[[LagReport], bool], timeout_s: float, what: str
) -> LagReport:
    deadline = time.monotonic() + timeout_s
    report = await monitor.tick()
    while not condition(report):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s:.0f}s; last report: {report.as_json()}")
        await asyncio.sleep(1.0)
        report = await monitor.tick()
    return report


def lag_sample(group: str, topic: str, partition: int) -> float | None:
    return REGISTRY.get_sample_value(
        "avcc_consumer_lag_messages", {"group": group, "topic": topic, "partition": str(partition)}
    )


# ----------------------------------------------------------------------------- lag monitor


async def test_lag_alert_fires_for_an_idle_group_and_resolves_once_it_catches_up(
    broker: KafkaKRaftBroker, unique: str
) -> None:
    topic, group = f"lagtest.apply.{unique}", f"lagtest-review-{unique}"
    create_topic(broker.bootstrap, topic, 6)
    produce(broker.bootstrap, topic, 1500)
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}")
    sink = RecordingSink()
    monitor = LagMonitor(settings, lag_config(topic, group), sinks=[sink])
    try:
        # Nobody has committed for the group: the whole topic is lag, 1500 > 1000.
        report = await tick_until(monitor, lambda r: bool(r.active_alerts), 30, "lag alert")
        (state,) = report.active_alerts
        assert (state.group, state.topic, state.lag) == (group, topic, 1500)
        assert sink.statuses() == ["firing"]
        assert sink.alerts[0].labels["alertname"] == "TestApplyLag"
        assert sum(lag_sample(group, topic, p) or 0 for p in range(6)) == 1500
        (status,) = [t for t in report.topics if t.group == group]
        assert status.status == "STOP"  # the group has no members at all

        consumer = consumer_for(broker.bootstrap, group, topic)
        try:
            assert consume(consumer, 1500) == 1500
            consumer.commit(asynchronous=False)
            report = await tick_until(monitor, lambda r: not r.active_alerts, 30, "alert resolution")
        finally:
            consumer.close()
        assert sink.statuses() == ["firing", "resolved"]
        (status,) = [t for t in report.topics if t.group == group]
        assert (status.lag, status.status) == (0, "OK")
        assert sum(lag_sample(group, topic, p) or 0 for p in range(6)) == 0
        # resolved once: further rounds send nothing
        await monitor.tick()
        assert sink.statuses() == ["firing", "resolved"]
    finally:
        await monitor.close()


async def test_consumer_that_stops_committing_is_stall_while_alive_then_stop(
    broker: KafkaKRaftBroker, unique: str
) -> None:
    topic, group = f"lagtest.stall.{unique}", f"lagtest-stall-{unique}"
    create_topic(broker.bootstrap, topic, 6)
    produce(broker.bootstrap, topic, 600)
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}")
    monitor = LagMonitor(settings, lag_config(topic, group, window_s=5.0), sinks=[RecordingSink()])
    consumer = consumer_for(broker.bootstrap, group, topic)
    try:
        assert consume(consumer, 200) == 200
        consumer.commit(asynchronous=False)  # commits part, then never again (but stays in the group)

        def status(report: LagReport) -> str:
            return next((t.status for t in report.topics if t.group == group), "absent")

        report = await tick_until(monitor, lambda r: status(r) == "STALL", 60, "STALL")
        (row,) = [t for t in report.topics if t.group == group]
        assert 0 < row.lag <= 400
        assert "frozen" in row.reason
        consumer.close()
        await tick_until(monitor, lambda r: status(r) == "STOP", 30, "STOP")
    finally:
        consumer.close()
        await monitor.close()


def test_print_lag_table_shows_the_group(
    broker: KafkaKRaftBroker, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.ops.lag.pages import print_lag_table

    topic, group = f"lagtest.cli.{unique}", f"lagtest-cli-{unique}"
    create_topic(broker.bootstrap, topic, 6)
    produce(broker.bootstrap, topic, 1500)
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}")
    assert print_lag_table(settings, lag_config(topic, group)) == 1  # 1500 > 1000
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["group", "topic", "partition", "end", "committed", "lag", "status"]
    assert sum(1 for line in out.splitlines() if line.startswith(group)) == 6
    assert "ALERT TestApplyLag" in out


def test_reader_ignores_groups_outside_the_prefix(broker: KafkaKRaftBroker, unique: str) -> None:
    topic, group = f"lagtest.prefix.{unique}", f"lagtest-prefix-{unique}"
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, 10)
    consumer = consumer_for(broker.bootstrap, group, topic)
    try:
        assert consume(consumer, 10) == 10
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}")
    config = LagSettings(rules=(), group_prefix=group)
    reader = OffsetReader(settings, watched=config.watched())
    try:
        snapshot = reader.snapshot()
    finally:
        reader.close()
    assert {p.group for p in snapshot.partitions} == {group}
    (row,) = snapshot.partitions
    assert (row.topic, row.end, row.committed, row.lag) == (topic, 10, 10, 0)


# ----------------------------------------------------------------------------- real worker processes


#: The operator login the lag tests' workers accept (``/lag`` and ``/lag.json`` are operator pages).
OPERATOR = {"AVCC_OPERATOR_USERS": json.dumps({"lag-ops": "lag-pass"})}
OPERATOR_AUTH = {"Authorization": "Basic " + base64.b64encode(b"lag-ops:lag-pass").decode()}


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, proc: ManagedProcess) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if not proc.running:
            raise AssertionError(f"{proc.name} exited while waiting for {what}\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s:.0f}s\n{proc.log_tail()}")
        time.sleep(0.5)


def worker_env(bootstrap: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
    env.update(
        {
            "AVCC_KAFKA_URL": f"kafka://{bootstrap}",
            "AVCC_DATA_DIR": str(data_dir),
            "AVCC_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "PYTHONPATH": os.pathsep.join([str(data_dir), str(ROOT)]),
            **extra,
        }
    )
    return env


def test_ops_worker_serves_metrics_health_ready_and_the_lag_console(
    broker: KafkaKRaftBroker, unique: str, tmp_path: Path
) -> None:
    topic, group = f"lagtest.ops.{unique}", f"lagtest-ops-{unique}"
    create_topic(broker.bootstrap, topic, 6)
    produce(broker.bootstrap, topic, 1500)
    # Deployed like production: the plan (the DLQ the ops worker indexes) exists before workers.
    apply_plan(Settings(kafka_url=f"kafka://{broker.bootstrap}"), [DLQ])
    port = free_port()
    rules = [{"name": "TestApplyLag", "topic": topic, "groups": [group], "max_lag": 1000}]
    env = worker_env(
        broker.bootstrap,
        tmp_path,
        AVCC_LAG_INTERVAL_S="1",
        AVCC_LAG_RULES=json.dumps(rules),
        AVCC_LAG_GROUP_PREFIX=group,
        **OPERATOR,
    )
    base = f"http://127.0.0.1:{port}"
    proc = worker_process(
        "ops-worker",
        [str(VENV_BIN / "faust"), "-A", "agents.ops", "worker", "--web-port", str(port), "-l", "info"],
        tmp_path,
        env,
        ready=lambda: http_get(f"{base}/health")[0] == 200,
    )
    proc.start()
    try:
        status, _, body = http_get(f"{base}/health")
        assert status == 200 and json.loads(body)["status"] == "ok"
        wait_for(lambda: http_get(f"{base}/ready")[0] == 200, 60, "/ready 200", proc)
        assert json.loads(http_get(f"{base}/ready")[2]) == {
            "group": "ops",
            "status": "ready",
            "consumer": False,
        }

        def alert_exported() -> bool:
            text = http_get(f"{base}/metrics")[2]
            return f'avcc_lag_alert_active{{group="{group}",rule="TestApplyLag",topic="{topic}"}} 1.0' in text

        wait_for(alert_exported, 60, "lag alert on /metrics", proc)
        status, content_type, text = http_get(f"{base}/metrics")
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        lags = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("avcc_consumer_lag_messages{") and f'group="{group}"' in line
        ]
        assert len(lags) == 6 and sum(lags) == 1500

        assert http_get(f"{base}/lag.json")[0] == 401 and http_get(f"{base}/lag")[0] == 401
        report = json.loads(http_get(f"{base}/lag.json", OPERATOR_AUTH)[2])
        (row,) = [g for g in report["groups"] if g["group"] == group]
        assert (row["topic"], row["lag"], len(row["partitions"])) == (topic, 1500, 6)
        assert [a["rule"] for a in report["alerts"]] == ["TestApplyLag"]
        status, content_type, page = http_get(f"{base}/lag", OPERATOR_AUTH)
        assert status == 200 and content_type.startswith("text/html")
        # one summary row for the group, its partitions (6) folded in the row
        assert page.count(f"<td>{group}</td>") == 1 and "TestApplyLag" in page
        assert page.count(f"data-group='{group}'") == 1  # the group's folded partitions
        assert page.count(f"data-topic='{topic}' data-partition=") == 6
    finally:
        started = time.monotonic()
        code = proc.stop()
        assert code is not None and code >= 0, f"worker needed SIGKILL (exit {code})\n{proc.log_tail()}"
        assert time.monotonic() - started < 30


WORKER_MODULE = textwrap.dedent(
    """
    import os

    import faust

    from app.platform.http.views import install_common_views

    app = faust.App(
        "avcc-" + os.environ["TEST_GROUP"],
        broker=os.environ["AVCC_KAFKA_URL"],
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=0.5,
        web_in_thread=False,
    )
    source = app.topic(os.environ["TEST_TOPIC"])


    @app.agent(source)
    async def count(stream):
        async for _ in stream:
            pass


    install_common_views(app, os.environ["TEST_GROUP"])
    """
)


def test_worker_exports_the_lag_of_its_own_partitions(
    broker: KafkaKRaftBroker, unique: str, tmp_path: Path
) -> None:
    topic, short_group = f"lagtest.worker.{unique}", f"lagw{unique}"
    group = f"avcc-{short_group}"
    create_topic(broker.bootstrap, topic, 6)
    produce(broker.bootstrap, topic, 1500)
    (tmp_path / "lagworker.py").write_text(WORKER_MODULE)
    port = free_port()
    env = worker_env(
        broker.bootstrap,
        tmp_path,
        TEST_GROUP=short_group,
        TEST_TOPIC=topic,
        AVCC_LAG_EXPORT_INTERVAL_S="1",
        **OPERATOR,
    )
    base = f"http://127.0.0.1:{port}"
    proc = worker_process(
        "lag-worker",
        [str(VENV_BIN / "faust"), "-A", "lagworker", "worker", "--web-port", str(port), "-l", "info"],
        tmp_path,
        env,
        ready=lambda: http_get(f"{base}/health")[0] == 200,
    )
    proc.start()
    try:
        wait_for(lambda: http_get(f"{base}/ready")[0] == 200, 90, "/ready 200", proc)
        ready = json.loads(http_get(f"{base}/ready")[2])
        assert ready["status"] == "ready" and ready["consumer"] is True and ready["partitions"] >= 6

        def lags() -> dict[str, float]:
            out: dict[str, float] = {}
            for line in http_get(f"{base}/metrics")[2].splitlines():
                if line.startswith("avcc_consumer_lag_messages{") and f'group="{group}"' in line:
                    labels, value = line.rsplit(" ", 1)
                    out[labels.split('partition="')[1].split('"')[0]] = float(value)
            return out

        # every source partition of this worker is exported, and the lag drains to 0 once committed
        wait_for(lambda: len(lags()) == 6 and sum(lags().values()) == 0, 90, "drained lag on /metrics", proc)
        assert sorted(lags()) == [str(p) for p in range(6)]
    finally:
        code = proc.stop()
        assert code is not None and code >= 0, f"worker needed SIGKILL (exit {code})\n{proc.log_tail()}"
