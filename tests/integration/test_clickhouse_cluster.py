"""The sink on a replicated, sharded ClickHouse cluster (2 shards x 2 replicas, ZooKeeper), with
members SIGKILLed under load: every event counted exactly once, on every replica."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
from clickhouse_driver import Client

from app.ops.lag.lifecycle import AlertEvent
from app.ops.lag.monitor import LagMonitor
from app.ops.lag.settings import LagRule, LagSettings, default_rules
from app.platform.faust.app import consumer_group_id
from app.platform.http.auth import sign_request
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import ANOMALY, DLQ, PLAYBACK_EVENT
from app.playback.sink.batch import SinkTopics
from app.playback.sink.clickhouse import ClickHouseBackend, connect
from app.playback.sink.cluster import LOCAL_SUFFIX
from app.playback.sink.store import (
    ANOMALY_INSERT_COLUMNS,
    ANOMALY_TABLE,
    PLAYBACK_INSERT_COLUMNS,
    PLAYBACK_TABLE,
    count_distinct_events,
    ensure_schema,
    list_anomalies,
    playback_stats,
)
from schemas.types import MAX_EPOCH_MS
from testing.clickhouse import ClickHouseServer
from testing.clickhouse_cluster import ClickHouseCluster
from tests.figures import Report
from tests.integration.stack import API_KEY, API_SECRET, Stack, run_avcc
from tests.integration.test_sink import (
    T0,
    Scenario,
    anomaly_value,
    expected_stats,
    playback_payload,
    start_worker,
    wait_for,
)

CLUSTER = "avcc"
#: Events posted through the gateway while one replica of each shard is SIGKILLed and restarted.
EVENTS = 200_000


def _client(node: ClickHouseServer, database: str = "default") -> Client:
    return Client("127.0.0.1", node.tcp_port, database=database, connect_timeout=3, send_receive_timeout=60)


def _url(cluster: ClickHouseCluster, database: str) -> str:
    return f"clickhouse://127.0.0.1:{cluster.nodes[0][0].tcp_port}/{database}"


def test_plan_and_apply_create_the_tables_on_every_member_then_verify_them(
    module_clickhouse_cluster: ClickHouseCluster,
) -> None:
    cluster = module_clickhouse_cluster
    database = f"plan_{uuid.uuid4().hex[:8]}"
    env = {"AVCC_CLICKHOUSE_URL": _url(cluster, database), "AVCC_CLICKHOUSE_CLUSTER": CLUSTER}
    plan = run_avcc(["clickhouse", "plan", "--database", database], env)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.count(f"ON CLUSTER {CLUSTER}") == 4
    assert "ReplicatedReplacingMergeTree" in plan.stdout and "Distributed(" in plan.stdout

    first = run_avcc(["clickhouse", "apply"], env, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert sorted(line.split()[1] for line in first.stdout.splitlines() if line.startswith("created")) == [
        "playback_anomalies",
        "playback_anomalies_local",
        "playback_events",
        "playback_events_local",
    ]
    again = run_avcc(["clickhouse", "apply"], env, timeout=300)
    assert again.returncode == 0 and "no drift" in again.stdout, again.stdout + again.stderr
    for node in cluster.members:
        engines = dict(
            _client(node).execute(
                "SELECT name, engine FROM system.tables WHERE database = %(db)s", {"db": database}
            )
        )
        assert engines == {
            "playback_events": "Distributed",
            "playback_events_local": "ReplicatedReplacingMergeTree",
            "playback_anomalies": "Distributed",
            "playback_anomalies_local": "ReplicatedReplacingMergeTree",
        }, node.data_dir.name


def test_a_table_of_another_schema_is_reported_never_dropped(
    module_clickhouse_cluster: ClickHouseCluster,
) -> None:
    cluster = module_clickhouse_cluster
    database = f"drift_{uuid.uuid4().hex[:8]}"
    first = _client(cluster.nodes[0][0])
    first.execute(f"CREATE DATABASE {database} ON CLUSTER {CLUSTER}")
    first.execute(
        f"CREATE TABLE {database}.playback_anomalies ON CLUSTER {CLUSTER} (x UInt8) "
        "ENGINE = MergeTree() ORDER BY x"
    )
    first.execute(f"INSERT INTO {database}.playback_anomalies VALUES", [(7,)])
    env = {"AVCC_CLICKHOUSE_URL": _url(cluster, database), "AVCC_CLICKHOUSE_CLUSTER": CLUSTER}
    done = run_avcc(["clickhouse", "apply"], env, timeout=300)
    assert done.returncode == 1
    assert "drift: playback_anomalies: engine MergeTree (code expects Distributed)" in done.stderr
    assert first.execute(f"SELECT x FROM {database}.playback_anomalies") == [(7,)]


def _replica_counts(cluster: ClickHouseCluster, database: str) -> dict[str, tuple[int, int]]:
    """(distinct event ids, rows after FINAL) of each member's local table."""
    counts: dict[str, tuple[int, int]] = {}
    for node in cluster.members:
        rows = _client(node, database).execute(
            f"SELECT uniqExact(event_id), count() FROM {PLAYBACK_TABLE}{LOCAL_SUFFIX} FINAL"
        )
        counts[node.data_dir.name] = (int(rows[0][0]), int(rows[0][1]))
    return counts


def _scenario(cluster: ClickHouseCluster, broker: Any, tmp_path: Path) -> tuple[Scenario, str]:
    """Database of one test's sink on the cluster, its tables made; its workers run as in
    production (the plan's topics and the sink's consumer group) on the test's own broker."""
    unique = uuid.uuid4().hex[:8]
    database = f"sink_{unique}"
    settings = Settings(
        kafka_url=f"kafka://{broker.bootstrap}",
        kafka_session_timeout_ms=6000,
        clickhouse_url=_url(cluster, database),
        clickhouse_cluster=CLUSTER,
        data_dir=tmp_path,
        dev_mode=True,
    )
    assert not apply_plan(settings, [PLAYBACK_EVENT, ANOMALY, DLQ]).unfixed
    scenario = Scenario(settings, SinkTopics(), consumer_group_id("sink"), settings.clickhouse_url, unique)
    backend = connect(settings.clickhouse_url, tmp_path, CLUSTER)
    try:
        assert ensure_schema(backend).created  # made by the test, so reads can start at once
    finally:
        backend.close()
    return scenario, database


def _sink(scenario: Scenario, tmp_path: Path) -> subprocess.Popen[bytes]:
    return start_worker(
        scenario,
        tmp_path / "sink.log",
        AVCC_CLICKHOUSE_CLUSTER=CLUSTER,
        AVCC_SINK_BATCH_MAX_ROWS="5000",
        AVCC_SINK_CONSUME_CHUNK="5000",
    )


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


def _stored(scenario: Scenario, events: int) -> dict[str, Any]:
    """The stats through the Distributed table, once they count at least ``events``."""
    backend = connect(scenario.clickhouse_url, scenario.settings.data_dir, CLUSTER)
    try:

        def stored() -> bool:
            return bool(playback_stats(backend, None, 0, MAX_EPOCH_MS)["events"] >= events)

        wait_for(stored, 300, f"{events} events through the cluster")
        return playback_stats(backend, None, 0, MAX_EPOCH_MS)
    finally:
        backend.close()


def _exactly_once_everywhere(
    cluster: ClickHouseCluster, scenario: Scenario, database: str, events: int, report: Report
) -> None:
    """The stats through the Distributed table count ``events`` once each; then every replica of
    every shard holds the same events, none twice, and the shards add up to ``events``."""
    assert _stored(scenario, events) == expected_stats(events)

    def replicated() -> bool:
        counts = _replica_counts(cluster, database)
        shards = [[counts[n.data_dir.name] for n in row] for row in cluster.nodes]
        return all(len(set(row)) == 1 for row in shards) and sum(row[0][0] for row in shards) == events

    wait_for(replicated, 180, "every replica to hold its shard's events")
    counts = _replica_counts(cluster, database)
    report(f"per replica (distinct events, rows after FINAL): {counts}; total {events}")
    for distinct, rows in counts.values():
        assert distinct == rows, counts
    assert sum(counts[row[0].data_dir.name][0] for row in cluster.nodes) == events


#: Items per partner batch posted to the gateway.
BATCH = 5_000
GATEWAY_ROUTE = "/v1/playback/events"
OPERATOR, PASSWORD = "operator", "operator-pass"
ANOMALIES = 5


def _partner_item(i: int, run: str) -> dict[str, Any]:
    """Item ``i`` as a partner posts it: test_sink's event ``i`` (so :func:`expected_stats`
    holds), its event id derived from ``idempotency_id`` by the gateway."""
    return {**playback_payload(i), "idempotency_id": f"{run}-{i}"}


def _post(stack: Stack, indexes: range, run: str) -> None:
    """POST items ``indexes`` through the gateway worker in batches of :data:`BATCH`, signed; a
    429 is posted again after its ``Retry-After``; every item must be accepted."""
    for first in range(indexes.start, indexes.stop, BATCH):
        items = [_partner_item(i, run) for i in range(first, min(first + BATCH, indexes.stop))]
        body = orjson.dumps(items)
        while True:
            headers = sign_request("POST", GATEWAY_ROUTE, body, API_KEY, API_SECRET)
            request = urllib.request.Request(
                stack.url("gateway") + GATEWAY_ROUTE,
                data=body,
                method="POST",
                headers={**headers, "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    answer = orjson.loads(response.read())
                    assert response.status == 202, answer
            except urllib.error.HTTPError as exc:
                assert exc.code == 429, exc.read()
                time.sleep(float(exc.headers.get("Retry-After", "1")))
                continue
            assert answer["accepted"] == len(items) and answer["rejected"] == 0, answer
            break


def _signed_get(stack: Stack, group: str, path_qs: str) -> Any:
    """The JSON answer of a signed ``GET`` to a worker of ``group``."""
    headers = sign_request("GET", path_qs, b"", API_KEY, API_SECRET)
    request = urllib.request.Request(stack.url(group) + path_qs, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        return orjson.loads(response.read())


def _console_home(stack: Stack) -> str:
    """The ops console's overview page, as the operator sees it."""
    login = base64.b64encode(f"{OPERATOR}:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(stack.url("ops") + "/", headers={"Authorization": f"Basic {login}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        return str(response.read().decode())


def _gateway_stack(scenario: Scenario, root: Path) -> Stack:
    """Gateway, sink (on the cluster) and ops console workers on the test's broker: the gateway
    writes the plan's playback topic, the console reads the sink."""
    env = {k: v for k, v in scenario.env().items() if k.startswith("AVCC_")}
    env.update(
        AVCC_CLICKHOUSE_CLUSTER=CLUSTER,
        AVCC_SINK_BATCH_MAX_ROWS="5000",
        AVCC_SINK_CONSUME_CHUNK="5000",
        AVCC_CONSOLE_KEY_ID=API_KEY,
    )
    stack = Stack(scenario.settings.kafka_url.removeprefix("kafka://"), root, env=env)
    stack.start("gateway", "sink")
    stack.env["AVCC_CONSOLE_SINK_URL"] = stack.url("sink")
    stack.start("ops")
    return stack


def test_gateway_events_with_replica_kills_count_once_on_every_replica_and_over_http(
    module_clickhouse_cluster: ClickHouseCluster, own_kafka: Any, tmp_path: Path, report: Report
) -> None:
    """200,000 events posted through the gateway while one replica of each shard is SIGKILLed and
    restarted: the stats route, the anomalies route and the console read them through the
    Distributed tables, each event counted once, and every replica holds its shard's events."""
    cluster = module_clickhouse_cluster
    scenario, database = _scenario(cluster, own_kafka, tmp_path)
    stack = _gateway_stack(scenario, tmp_path / "stack")
    victims = [cluster.nodes[0][1], cluster.nodes[1][0]]  # one replica of each shard
    quarter = EVENTS // 4
    run = scenario.run
    try:
        began = time.monotonic()
        _post(stack, range(0, quarter), run)
        victims[0].kill()
        _post(stack, range(quarter, 2 * quarter), run)
        victims[0].start()
        victims[1].kill()
        _post(stack, range(2 * quarter, 3 * quarter), run)
        victims[1].start()
        _post(stack, range(3 * quarter, EVENTS), run)
        _post(stack, range(0, 1000), run)  # a partner's retried items: the same event ids
        report(f"{EVENTS + 1000:,} items posted through the gateway in {time.monotonic() - began:.1f} s")
        _exactly_once_everywhere(cluster, scenario, database, EVENTS, report)

        assert _signed_get(stack, "sink", "/v1/playback/stats") == expected_stats(EVENTS)
        backend = connect(scenario.clickhouse_url, tmp_path, CLUSTER)
        try:
            code = "MA.156.10005.8361/w7"
            by_code = _signed_get(stack, "sink", f"/v1/playback/stats?avcc_code={code}")
            assert by_code == playback_stats(backend, code, 0, MAX_EPOCH_MS)
            assert by_code["events"] == len(range(7, EVENTS, 40)), by_code

            scenario.produce([anomaly_value(k) for k in range(ANOMALIES)], scenario.topics.anomaly)
            wait_for(
                lambda: len(list_anomalies(backend, None, None, 0, MAX_EPOCH_MS, 100)) == ANOMALIES,
                60,
                f"{ANOMALIES} anomalies through the cluster",
            )
            stored = list_anomalies(backend, None, None, 0, MAX_EPOCH_MS, 100)
        finally:
            backend.close()
        answer = _signed_get(stack, "sink", "/v1/playback/anomalies?limit=100")
        assert answer == {"anomalies": json.loads(json.dumps(stored))}
        ids = [f"anomaly-{k}" for k in range(ANOMALIES)]
        assert sorted(a["anomaly_id"] for a in answer["anomalies"]) == ids
        page = _console_home(stack)
        assert sorted(re.findall(r"<li class='anomaly'>[^<]*anomaly_id=(anomaly-\d+)", page)) == ids, page
        report(f"stats, anomalies and the console read through the Distributed tables: {by_code}")
    finally:
        for node in victims:
            node.start()
        stack.stop_all()


def _playback_lag_monitor(scenario: Scenario) -> tuple[LagMonitor, LagRule]:
    """The lag monitor with the pipeline's playback lag rule, pointed at this test's topic and
    group, at a threshold below the events queued while the shard is down."""
    rule = next(r for r in default_rules() if r.topic == PLAYBACK_EVENT.name)
    rule = rule.model_copy(
        update={"topic": scenario.topics.playback, "groups": (scenario.group_id,), "max_lag": LAG_THRESHOLD}
    )
    return LagMonitor(scenario.settings, LagSettings(rules=(rule,), interval_s=1.0), sinks=[]), rule


async def _until(monitor: LagMonitor, kind: str, deadline_s: float) -> AlertEvent:
    """Tick ``monitor`` until its rule sends a ``kind`` event (``firing``/``resolved``)."""
    started = time.monotonic()
    while True:
        report = await monitor.tick()
        events = [e for e in report.events if e.kind == kind]
        if events:
            return events[0]
        assert time.monotonic() - started < deadline_s, f"the playback lag alert was not {kind}"
        await asyncio.sleep(1.0)


#: How long a whole shard stays down while events keep coming, and the lag that fires the alert.
SHARD_DOWN_S = 30.0
LAG_THRESHOLD = 5_000


def test_a_whole_shard_down_for_30_s_backs_the_sink_off_loses_nothing_and_alerts(
    module_clickhouse_cluster: ClickHouseCluster, own_kafka: Any, tmp_path: Path, report: Report
) -> None:
    cluster = module_clickhouse_cluster
    scenario, database = _scenario(cluster, own_kafka, tmp_path)
    worker = _sink(scenario, tmp_path)
    monitor, rule = _playback_lag_monitor(scenario)
    shard = cluster.nodes[1]
    events = 20_000
    try:
        scenario.produce(scenario.playback(range(0, events // 2)))
        _stored(scenario, events // 2)  # the sink is at work before the shard goes
        for node in shard:
            node.kill()
        down_since = time.monotonic()
        scenario.produce(scenario.playback(range(events // 2, events)))
        fired = asyncio.run(_until(monitor, "firing", SHARD_DOWN_S))
        assert fired.lag > LAG_THRESHOLD and fired.rule.name == rule.name == "AvccPlaybackEventLag"
        report(f"lag alert fired {time.monotonic() - down_since:.1f} s into the outage, lag {fired.lag}")
        time.sleep(max(0.0, SHARD_DOWN_S - (time.monotonic() - down_since)))
        assert worker.poll() is None, "the sink died while a shard was down"
        for node in shard:
            node.start()
        _exactly_once_everywhere(cluster, scenario, database, events, report)
        resolved = asyncio.run(_until(monitor, "resolved", 120))
        report(f"lag alert resolved, lag {resolved.lag}")
        log = (tmp_path / "sink.log").read_text()
        assert "storing a batch of" in log and "retry in" in log, "the sink never backed off"
    finally:
        for node in shard:
            node.start()
        _stop(worker)
        asyncio.run(monitor.close())


# --- the same answers everywhere -----------------------------------------------------------------

#: Runs in a process of its own (chDB serves one data path per process): inserts the blocks of
#: ``argv[2]`` into chDB at ``argv[1]`` and prints the answers of :func:`_answers`.
_CHDB_SIDE = """
import json, sys
from pathlib import Path
from app.playback.sink.clickhouse import ClickHouseBackend, connect
from tests.integration.test_clickhouse_cluster import _answers, _load
backend = connect("chdb://" + sys.argv[1], Path(sys.argv[1]))
_load(backend, json.loads(Path(sys.argv[2]).read_text()))
print(json.dumps(_answers(backend)))
"""
CODES = [f"MA.156.10005.8361/EQ{k:03d}" for k in range(7)]


def _blocks() -> list[dict[str, Any]]:
    """Playback and anomaly blocks with duplicates across blocks (redeliveries)."""
    events = [
        [
            f"eq-{i}",
            T0 + i * 1000,
            "gateway-svc",
            CODES[i % len(CODES)],
            "8361",
            f"sha256:{i % 53:064x}",
            ("play", "complete", "purchase")[i % 3],
            i % 600,
            125 if i % 3 == 2 else 0,
            "",
            i % 24,
            i,
        ]
        for i in range(3000)
    ]
    anomalies = [
        [
            f"anomaly-{k}",
            ("traffic_spike", "revenue_drop")[k % 2],
            CODES[k % len(CODES)],
            "8361",
            "",
            T0 + k * 60_000,
            T0 + (k + 1) * 60_000,
            100.0 + k,
            None if k % 4 == 0 else 10.0,
            50.0,
            f'{{"events": {100 + k}}}',
            T0 + (k + 1) * 60_000,
            f"eq-{k}",
            "anomaly-svc",
            k % 6,
            k,
        ]
        for k in range(20)
    ]
    return [
        {"table": PLAYBACK_TABLE, "rows": events[:2000]},
        {"table": PLAYBACK_TABLE, "rows": events[1700:]},  # 300 redelivered
        {"table": ANOMALY_TABLE, "rows": anomalies[:15]},
        {"table": ANOMALY_TABLE, "rows": anomalies[10:]},  # 5 redelivered
    ]


def _load(backend: ClickHouseBackend, blocks: list[dict[str, Any]]) -> None:
    ensure_schema(backend)
    for block in blocks:
        names = PLAYBACK_INSERT_COLUMNS if block["table"] == PLAYBACK_TABLE else ANOMALY_INSERT_COLUMNS
        columns = [list(column) for column in zip(*block["rows"], strict=True)]
        backend.insert_columns(block["table"], names, columns)


def _answers(backend: ClickHouseBackend) -> dict[str, Any]:
    """What the stats and anomaly routes would answer, over several filters."""
    return {
        "all": playback_stats(backend, None, 0, MAX_EPOCH_MS),
        "codes": [playback_stats(backend, code, 0, MAX_EPOCH_MS) for code in CODES],
        "range": playback_stats(backend, None, T0 + 500_000, T0 + 2_500_000),
        "distinct": count_distinct_events(backend),
        "anomalies": list_anomalies(backend, None, None, 0, MAX_EPOCH_MS, 100),
        "by_rule": list_anomalies(backend, None, "revenue_drop", 0, MAX_EPOCH_MS, 5),
        "by_code": list_anomalies(backend, CODES[3], None, T0, T0 + 10 * 60_000, 100),
    }


def test_the_same_queries_answer_the_same_on_chdb_one_server_and_the_cluster(
    module_clickhouse_cluster: ClickHouseCluster,
    clickhouse_server: ClickHouseServer,
    tmp_path: Path,
    report: Report,
) -> None:
    blocks = _blocks()
    data = tmp_path / "blocks.json"
    data.write_text(json.dumps(blocks))
    chdb = subprocess.run(
        [sys.executable, "-c", _CHDB_SIDE, str(tmp_path / "chdb"), str(data)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    answers = {"chdb": json.loads(chdb.stdout.strip().splitlines()[-1])}
    database = f"same_{uuid.uuid4().hex[:8]}"
    single_url = f"clickhouse://127.0.0.1:{clickhouse_server.tcp_port}/{database}"
    for name, backend in (
        ("one server", connect(single_url, tmp_path)),
        ("cluster", connect(_url(module_clickhouse_cluster, database), tmp_path, CLUSTER)),
    ):
        try:
            _load(backend, blocks)
            answers[name] = json.loads(json.dumps(_answers(backend)))
        finally:
            backend.close()
    reference = answers["chdb"]
    assert reference["distinct"] == 3000 and reference["all"]["events"] == 3000
    assert len(reference["anomalies"]) == 20 and len(reference["by_rule"]) == 5
    report(f"the same answers on {', '.join(answers)}: {reference['all']}")
    for name, answer in answers.items():
        assert answer == reference, name
