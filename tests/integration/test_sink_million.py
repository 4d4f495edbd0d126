"""The issue's checked scenario: 1,000,000 events, a SIGKILLed sink worker, a 30 s ClickHouse outage.

A real ``avcc worker sink`` subprocess consumes a uuid-suffixed playback topic on the local
Kafka broker into its own database on the ClickHouse 18.16 server while a paced producer
(the playback profile) writes 1,000,000 envelopes of ~320 bytes keyed by event id. Once
>= 300k rows landed the worker is SIGKILLed and started again; after it resumed, ClickHouse is
stopped for 30 s and started again. In the end the shipped stats query (direct and over signed
HTTP) counts exactly 1,000,000 distinct events; stored rows may include redelivered duplicates.

Timings are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

import tests.integration.test_sink as sink_tests
from app.platform.http.auth import sign_request
from app.platform.kafka.producers import profile_config
from app.playback.sink.clickhouse import connect
from app.playback.sink.store import count_distinct_events, playback_stats
from schemas.types import MAX_EPOCH_MS
from testing.clickhouse import ClickHouseServer
from tests.figures import Report
from tests.integration.stack import API_KEY, API_SECRET, Stack
from tests.integration.test_sink import Scenario, expected_stats, playback_value, stored_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: A sink worker as in production (the plan's topics, the sink's group) on a broker of the test's
#: own, with a ClickHouse database of its own (``test_sink``'s).
scenario = sink_tests.worker_scenario

TOTAL = 1_000_000
KILL_AFTER_ROWS = 300_000
OUTAGE_S = 30.0
#: Events per second the producer is paced at: production spans the kill and the outage.
PRODUCE_RATE = 20_000
#: Settings of the worker that differ from production defaults (faster retries after the outage).
WORKER_ENV = {"AVCC_SINK_BACKOFF_MAX_S": "2", "AVCC_LOG_LEVEL": "INFO"}
STATS_ROUTE = "/v1/playback/stats"


class PacedProducer(threading.Thread):
    """Produces events ``0..total-1`` of ``run`` at ``rate`` per second (playback profile)."""

    def __init__(self, scenario: Scenario, total: int, rate: float) -> None:
        super().__init__(name="million-producer", daemon=True)
        self.scenario = scenario
        self.total = total
        self.rate = rate
        self.produced = 0
        self.failed: list[KafkaError] = []
        self.error: BaseException | None = None
        self.seconds = 0.0
        self._halted = threading.Event()

    def halt(self) -> None:
        self._halted.set()

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:
            self.error = exc

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failed.append(err)

    def _produce(self) -> None:
        settings = self.scenario.settings
        producer = Producer({**profile_config(settings, "playback"), "client.id": "million-test"})
        topic, run, delivered = self.scenario.topics.playback, self.scenario.run, self._delivered
        produce, poll = producer.produce, producer.poll
        started = time.monotonic()
        for i in range(self.total):
            value = playback_value(i, run)
            while True:
                try:
                    produce(topic, value, value[13:49], on_delivery=delivered)  # key: the event id
                    break
                except BufferError:
                    poll(0.05)
            if i % 2000 == 1999:
                self.produced = i + 1
                poll(0)
                ahead = started + (i + 1) / self.rate - time.monotonic()
                if ahead > 0 and self._halted.wait(ahead):
                    break
                if self._halted.is_set():
                    break
        left = producer.flush(120)
        self.produced = self.total
        self.seconds = time.monotonic() - started
        if left:
            raise RuntimeError(f"{left} playback events not delivered")


def readiness(stack: Stack) -> tuple[int, str]:
    """``GET /ready`` of the sink worker: (status, reason); (0, error) when it does not answer."""
    try:
        with urllib.request.urlopen(stack.url("sink") + "/ready", timeout=5) as response:
            return int(response.status), ""
    except urllib.error.HTTPError as exc:
        return exc.code, str(orjson.loads(exc.read()).get("reason", ""))
    except OSError as exc:
        return 0, str(exc)


def http_stats(stack: Stack) -> dict[str, Any]:
    """``GET /v1/playback/stats`` (whole time range, every code) of the sink worker, signed."""
    request = urllib.request.Request(
        stack.url("sink") + STATS_ROUTE, headers=sign_request("GET", STATS_ROUTE, b"", API_KEY, API_SECRET)
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        body: dict[str, Any] = orjson.loads(response.read())
    return body


def _cleanup(scenario: Scenario, clickhouse_server: ClickHouseServer) -> None:
    """Free the broker's and the server's disk.

    Best effort: the broker is the test's own and the database uuid-named, a leftover harms no
    other test.
    """
    try:
        admin = AdminClient(scenario.settings.kafka_client_config())
        for future in admin.delete_topics([scenario.topics.playback], operation_timeout=30).values():
            future.result(timeout=30)
        backend = connect(clickhouse_server.url, scenario.settings.data_dir)
        try:
            backend.execute(f"DROP DATABASE IF EXISTS {scenario.clickhouse_url.rsplit('/', 1)[1]}")
        finally:
            backend.close()
    except Exception as exc:
        print(f"# cleanup incomplete: {exc}")


def test_a_million_events_survive_a_sigkill_and_a_clickhouse_outage_counted_exactly_once(
    scenario: Scenario, clickhouse_server: ClickHouseServer, tmp_path: Path, report: Report
) -> None:
    began = time.monotonic()
    env = {k: v for k, v in scenario.env().items() if k.startswith("AVCC_")}
    # The sink's production batch sizes (50k rows / 1 s), not test_sink's small ones.
    env.pop("AVCC_SINK_BATCH_MAX_ROWS")
    env.pop("AVCC_SINK_BATCH_MAX_SECONDS")
    stack = Stack(
        scenario.settings.kafka_url.removeprefix("kafka://"), tmp_path / "stack", env={**env, **WORKER_ENV}
    )
    worker = stack.worker("sink")
    backend = scenario.backend()
    producer = PacedProducer(scenario, TOTAL, PRODUCE_RATE)
    timings: dict[str, float] = {}

    def mark(name: str) -> float:
        timings[name] = time.monotonic() - began
        return timings[name]

    def rows() -> int:
        return stored_rows(backend)

    try:
        worker.start(wait=False)
        producer.start()
        worker.wait_ready()
        mark("worker ready")

        # 1. SIGKILL the worker mid-stream.
        wait_for(lambda: rows() >= KILL_AFTER_ROWS, 90, f"{KILL_AFTER_ROWS:,} rows stored", step=0.05)
        mark("kill")
        worker.kill()
        rows_at_kill = rows()
        produced_at_kill = producer.produced
        assert rows_at_kill < TOTAL, "the kill came too late to prove anything"

        # 2. Restart it: it resumes from the committed offsets.
        worker.start()
        mark("restarted")
        wait_for(lambda: rows() >= rows_at_kill + 50_000, 60, "the restarted worker storing again", step=0.1)
        mark("resumed")

        # 3. ClickHouse down for 30 s while the worker has a backlog (and events keep coming).
        rows_before_outage = rows()
        produced_at_outage = producer.produced
        mark("outage")
        clickhouse_server.stop()
        mark("clickhouse down")
        try:
            wait_for(lambda: "ClickHouse" in readiness(stack)[1], 30, "the sink to pause on the outage")
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began - timings["clickhouse down"])))
            assert worker.running, worker.log_tail()
        finally:
            clickhouse_server.start()
        mark("clickhouse back")

        # 4. Everything arrives; each event counts once.
        producer.join(120)
        assert not producer.is_alive(), "the producer did not finish"
        assert producer.error is None, producer.error
        assert not producer.failed, producer.failed[:5]
        wait_for(lambda: rows() >= TOTAL, 150, f"{TOTAL:,} rows stored", step=0.5)
        mark("all rows")
        wait_for(lambda: count_distinct_events(backend) == TOTAL, 60, f"exactly {TOTAL:,} distinct events", 1)
        stats = playback_stats(backend, None, 0, MAX_EPOCH_MS)
        mark("stats")
        assert stats["events"] == TOTAL
        assert stats == expected_stats(TOTAL)
        assert count_distinct_events(backend) == TOTAL
        stored = rows()
        assert stored >= TOTAL  # redelivered duplicates may be stored; no query counts them
        assert http_stats(stack) == stats
        assert worker.stop() == 0, worker.log_tail()
        t = timings
        drain_s = t["all rows"] - t["clickhouse back"]
        figures = [
            f"{TOTAL:,} events produced in {producer.seconds:.1f}s "
            f"({TOTAL / producer.seconds:,.0f}/s, paced at {PRODUCE_RATE:,}/s)",
            f"worker ready after {t['worker ready']:.1f}s; SIGKILL at {t['kill']:.1f}s: "
            f"{rows_at_kill:,} rows stored ({rows_at_kill / (t['kill'] - t['worker ready']):,.0f} rows/s), "
            f"{produced_at_kill:,} produced",
            f"restarted worker ready {t['restarted'] - t['kill']:.1f}s and storing "
            f"{t['resumed'] - t['kill']:.1f}s after the kill",
            f"ClickHouse stopped at {t['outage']:.1f}s: {rows_before_outage:,} rows stored, "
            f"{produced_at_outage:,} produced; stop took {t['clickhouse down'] - t['outage']:.1f}s, "
            f"down {t['clickhouse back'] - t['clickhouse down']:.1f}s",
            f"after the outage: {stored - rows_before_outage:,} rows in {drain_s:.1f}s "
            f"({(stored - rows_before_outage) / max(drain_s, 1e-3):,.0f} rows/s)",
            f"stored rows {stored:,} (unmerged duplicates {stored - TOTAL:,}); distinct events {TOTAL:,}; "
            f"stats query {t['stats'] - t['all rows']:.1f}s",
            f"total {time.monotonic() - began:.1f}s",
        ]
        for line in figures:
            report(line)
    finally:
        producer.halt()
        producer.join(30)
        stack.stop_all()
        backend.close()
        if not clickhouse_server.running:
            clickhouse_server.start()
        _cleanup(scenario, clickhouse_server)
