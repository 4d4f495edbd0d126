"""Playback-path benchmark: events per CPU second of the gateway, sink and anomaly detector,
against four baselines, all on the same generated data in one run.

    .venv/bin/python -m bench.playback [--events 200000] [--bootstrap HOST:PORT]
                                       [--clickhouse-url URL] [--only gateway,sink,...]
                                       [--repeat N]

1. Generates ``--events`` valid playback payloads (envelopes ~330 bytes on the topic).
2. Broker: ``--bootstrap`` or an embedded Apache Kafka (KRaft, its data in the temp dir) on a
   free port, stopped at the end. ClickHouse: ``--clickhouse-url`` (a server: the bench writes into database
   ``avcc_bench`` unless the URL names one) or chDB in a temp dir.
3. Measures, each in its own process so its CPU seconds are its own (``/proc`` for the gateway
   worker, ``time.process_time()`` inside the others, from the first event to the last):

   a. ``gateway``  the real gateway worker (``avcc worker gateway``, loaded once it reports
                   ``/ready``): signed HTTP batches -> Kafka (the load generator is the parent
                   process)
   b. ``sink``     the ClickHouse sink's batch loop (``app.playback.sink.runner.SinkRunner``)
   c. ``anomaly``  the anomaly detector's loop (``app.playback.anomaly.detector.AnomalyDetector``)
   d. ``faust``    baseline: a faust agent counting events one at a time (orjson decode);
                   only the first ``--faust-events`` (50k) of the data, to keep the run short
   e. ``quix``     baseline: a Quix Streams app counting the same topic
   f. ``raw``      baseline: confluent-kafka ``consume(10k)`` + orjson + columnar insert of
                   8 columns into a plain ``MergeTree``
   g. ``raw_sink`` baseline: the same loop writing the sink's own rows (its insert columns,
                   unchecked) into the sink's own table: what the sink's ratio is judged by

   (b)-(g) read the topic (a) filled, each with a fresh consumer group. Embedded ClickHouse
   (chDB) runs inside the measured process, so its insert work counts for (b), (f) and (g).
4. With ``--repeat N``, runs (b)-(g) N times in turns and keeps each one's median run; the
   gateway too runs N times (the first fills the topic, the others a scratch topic each).
5. Prints a table (with each figure's ratio to the baselines) and one JSON line per figure:
   ``{"name", "status": "ok", "events", "wall_s", "cpu_s", "events_per_s", "events_per_cpu_s",
   "x_baselines"}`` (plus ``runs_events_per_cpu_s``, every run's figure, when repeated). A
   component that cannot be measured (the Quix baseline without ``quixstreams``, a crash, a
   timeout) is the line ``{"name", "status": "failed", "reason"}`` and the others still print;
   the bench then exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import orjson

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.client import settled, signed_call  # noqa: E402
from bench.data import code, user_hash  # noqa: E402
from bench.figures import OK, MissingPackage, failed, is_ok, measure, print_figures  # noqa: E402

KEY, SECRET = "bench", "bench-secret"
ROUTE = "/v1/playback/events"
COMPONENTS = ("gateway", "sink", "anomaly", "faust", "quix", "raw", "raw_sink")
BASELINES = ("faust", "quix", "raw", "raw_sink")
SESSION_TIMEOUT_MS = 6000
RESULT_PREFIX = "RESULT "


# --- data ------------------------------------------------------------------------------------


def generate(events: int, seed: int = 42) -> list[dict[str, Any]]:
    """``events`` valid playback payloads: 5k codes, 50 nodes, 100k users, realistic type mix."""
    rng = random.Random(seed)
    users = [user_hash(i) for i in range(min(100_000, max(1, events // 2)))]
    nodes = [str(8300 + i) for i in range(50)]
    items = []
    for _ in range(events):
        kind = rng.choices(("play", "complete", "purchase"), (80, 17, 3))[0]
        items.append(
            {
                "avcc_code": code(rng.randrange(5000)),
                "platform_node": rng.choice(nodes),
                "user_hash": rng.choice(users),
                "event_type": kind,
                "duration_sec": rng.randint(1, 7200) if kind != "purchase" else 0,
                "revenue_cny": f"{rng.randint(100, 9900) / 100:.2f}" if kind == "purchase" else "0.00",
            }
        )
    return items


# --- measurement helpers ----------------------------------------------------------------------


def result(name: str, events: int, wall_s: float, cpu_s: float, **extra: Any) -> dict[str, Any]:
    """One measured figure."""
    return {
        "name": name,
        "status": OK,
        "events": events,
        "wall_s": round(wall_s, 3),
        "cpu_s": round(cpu_s, 3),
        "events_per_s": round(events / wall_s) if wall_s > 0 else None,
        "events_per_cpu_s": round(events / cpu_s) if cpu_s > 0 else None,
        **extra,
    }


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def wait_until(
    done: Callable[[], bool], started: Callable[[], bool], timeout_s: float
) -> tuple[float, float, float, float]:
    """Poll; returns (t0, cpu0, t1, cpu1): times when ``started`` then ``done`` became true."""
    deadline = time.monotonic() + timeout_s
    t0 = cpu0 = None
    while True:
        if t0 is None and started():
            t0, cpu0 = time.perf_counter(), time.process_time()
        if t0 is not None and done():
            assert cpu0 is not None
            return t0, cpu0, time.perf_counter(), time.process_time()
        if time.monotonic() > deadline:
            raise TimeoutError("component did not finish in time")
        time.sleep(0.005)


def emit(payload: dict[str, Any]) -> None:
    """The component's result line on the real stdout (faust redirects ``sys.stdout`` to its log)."""
    os.write(1, (RESULT_PREFIX + json.dumps(payload) + "\n").encode())


def kafka_settings(args: argparse.Namespace, component: str) -> Any:
    from app.platform.settings import Settings

    return Settings(
        kafka_url=f"kafka://{args.bootstrap}",
        kafka_session_timeout_ms=SESSION_TIMEOUT_MS,
        data_dir=Path(args.workdir) / component,
        clickhouse_url=args.clickhouse_url or "chdb:///unused",
    )


def clickhouse_url(args: argparse.Namespace, component: str) -> str:
    if args.clickhouse_url:
        return str(args.clickhouse_url)
    return f"chdb://{Path(args.workdir).resolve() / ('chdb-' + component)}"


# --- components (each runs in its own process: ``--component NAME``) --------------------------


def run_sink(args: argparse.Namespace) -> dict[str, Any]:
    from app.playback.sink.batch import SinkTopics
    from app.playback.sink.runner import SinkRunner
    from app.playback.sink.settings import SinkSettings

    settings = kafka_settings(args, "sink")
    runner = SinkRunner(
        settings,
        config=SinkSettings(),
        topics=SinkTopics(playback=args.topic, anomaly=args.anomaly_topic, dlq=args.dlq_topic),
        group_id=f"bench-sink-{uuid.uuid4().hex[:8]}",
        clickhouse_url=clickhouse_url(args, "sink"),
    )
    runner.start()
    stats = runner.loop.stats
    try:
        t0, c0, t1, c1 = wait_until(
            lambda: stats.rows_written >= args.events, lambda: stats.consumed > 0, args.timeout
        )
    finally:
        runner.close()
    return result("sink", stats.rows_written, t1 - t0, c1 - c0, dead_lettered=stats.dead_lettered)


def run_anomaly(args: argparse.Namespace) -> dict[str, Any]:
    from app.playback.anomaly.detector import AnomalyDetector
    from app.playback.anomaly.settings import AnomalySettings

    u = uuid.uuid4().hex[:8]
    detector = AnomalyDetector(
        kafka_settings(args, "anomaly"),
        AnomalySettings(),
        source_topic=args.topic,
        anomaly_topic=args.anomaly_topic,
        changelog_topic=f"bench-anomaly-changelog-{u}",
        partials_topic=f"bench-anomaly-partials-{u}",
        merge_changelog_topic=f"bench-anomaly-merge-changelog-{u}",
        group_id=f"bench-anomaly-{u}",
        state_dir=Path(args.workdir) / f"anomaly-{u}",
    )
    thread = threading.Thread(target=detector.run, name="detector")
    thread.start()
    try:
        t0, c0, t1, c1 = wait_until(
            lambda: detector.processed >= args.events, lambda: detector.processed > 0, args.timeout
        )
    finally:
        detector.stop()
        thread.join(60)
    return result("anomaly", detector.processed, t1 - t0, c1 - c0, anomalies=detector.anomalies)


def run_faust(args: argparse.Namespace) -> dict[str, Any]:
    import faust

    from testing.ports import free_port

    u = uuid.uuid4().hex[:8]
    app = faust.App(
        f"bench-faust-{u}",
        broker=f"kafka://{args.bootstrap}",  # faust's own aiokafka transport, as the workers use it
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        datadir=str(Path(args.workdir) / f"faust-{u}"),
        web_port=free_port(),
        web_host="127.0.0.1",
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=SESSION_TIMEOUT_MS / 1000,
        broker_heartbeat_interval=1.0,
        topic_disable_leader=True,
    )
    topic = app.topic(args.topic, value_serializer="raw", partitions=24)
    state: dict[str, Any] = {"n": 0}
    target = args.events

    @app.agent(topic)
    async def count(stream: Any) -> None:
        async for value in stream:
            orjson.loads(value)
            state["n"] += 1
            if state["n"] == 1:
                state["t0"], state["c0"] = time.perf_counter(), time.process_time()
            if state["n"] >= target:
                wall, cpu = time.perf_counter() - state["t0"], time.process_time() - state["c0"]
                emit(result("faust", state["n"], wall, cpu))
                os._exit(0)

    worker = faust.Worker(app, loglevel=os.environ.get("BENCH_FAUST_LOGLEVEL", "WARNING"), quiet=True)
    worker.execute_from_commandline()
    raise SystemExit("faust worker stopped before counting every event")


def run_quix(args: argparse.Namespace) -> dict[str, Any]:
    try:
        from quixstreams import Application
    except ImportError as exc:
        raise MissingPackage("quixstreams") from exc

    u = uuid.uuid4().hex[:8]
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=f"bench-quix-{u}",
        auto_offset_reset="earliest",
        state_dir=str(Path(args.workdir) / f"quix-{u}"),
        loglevel="WARNING",
        auto_create_topics=False,
        consumer_extra_config={"session.timeout.ms": SESSION_TIMEOUT_MS},
    )
    state: dict[str, Any] = {"n": 0}
    target = args.events

    def counter(_value: Any) -> None:
        state["n"] += 1
        if state["n"] == 1:
            state["t0"], state["c0"] = time.perf_counter(), time.process_time()
        if state["n"] >= target and "t1" not in state:
            state["t1"], state["c1"] = time.perf_counter(), time.process_time()
            app.stop()

    sdf = app.dataframe(app.topic(args.topic, value_deserializer="json"))
    sdf.update(counter)
    app.run()
    return result("quix", state["n"], state["t1"] - state["t0"], state["c1"] - state["c0"])


#: The narrow baseline's table: 8 columns, no server-side defaults, a plain MergeTree.
RAW_COLUMNS = (
    "event_id",
    "ts",
    "avcc_code",
    "platform_node",
    "user_hash",
    "event_type",
    "duration_sec",
    "revenue_cny",
)


def _raw_narrow_rows(messages: list[Any], columns: list[list[Any]]) -> None:
    """The 8 columns of :data:`RAW_COLUMNS` of every message (no checks)."""
    loads = orjson.loads
    ids, tss, codes, nodes, users, kinds, durations, revenues = columns
    for message in messages:
        if message.error() is not None:
            continue
        e = loads(message.value())
        p = e["payload"]
        ids.append(e["event_id"])
        tss.append(e["timestamp"])
        codes.append(p["avcc_code"])
        nodes.append(p["platform_node"])
        users.append(p["user_hash"])
        kinds.append(p["event_type"])
        durations.append(p["duration_sec"])
        revenues.append(float(p["revenue_cny"]))


def _raw_sink_rows(messages: list[Any], columns: list[list[Any]]) -> None:
    """The sink's insert columns of every message (``PLAYBACK_INSERT_COLUMNS``; no checks)."""
    loads = orjson.loads
    ids, tss, sources, codes, nodes, users, kinds, durations, cents, tokens, partitions, offsets = columns
    for message in messages:
        if message.error() is not None:
            continue
        e = loads(message.value())
        p = e["payload"]
        ids.append(e["event_id"])
        tss.append(e["timestamp"])
        sources.append(e["source"])
        codes.append(p["avcc_code"])
        nodes.append(p["platform_node"])
        users.append(p["user_hash"])
        kinds.append(p["event_type"])
        durations.append(p["duration_sec"])
        cents.append(round(float(p["revenue_cny"]) * 100))
        tokens.append(p.get("idempotency_id") or "")
        partitions.append(message.partition())
        offsets.append(message.offset())


def _raw_consume(
    args: argparse.Namespace,
    name: str,
    create_table: Callable[[Any], str],
    names: list[str],
    rows: Callable[[list[Any], list[list[Any]]], None],
) -> dict[str, Any]:
    """A bare confluent-kafka loop: ``consume(10k)``, ``rows`` into columns, one insert per 50k
    into the table ``create_table(backend)`` creates and names."""
    from confluent_kafka import Consumer

    from app.playback.sink.clickhouse import connect

    u = uuid.uuid4().hex[:8]
    backend = connect(clickhouse_url(args, name), Path(args.workdir))
    table = create_table(backend)
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"bench-{name}-{u}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
        }
    )
    consumer.subscribe([args.topic])
    done = 0
    t0 = c0 = 0.0
    deadline = time.monotonic() + args.timeout
    columns: list[list[Any]] = [[] for _ in names]
    while done < args.events:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} baseline did not finish in time")
        messages = consumer.consume(10_000, timeout=0.5)
        if not messages:
            continue
        if not done:
            t0, c0 = time.perf_counter(), time.process_time()
        rows(messages, columns)
        count = len(columns[0])
        if count >= 50_000 or done + count >= args.events:
            backend.insert_columns(table, names, columns)
            done += count
            consumer.commit(asynchronous=True)
            columns = [[] for _ in names]
    t1, c1 = time.perf_counter(), time.process_time()
    consumer.close()
    backend.close()
    return result(name, done, t1 - t0, c1 - c0)


def _narrow_table(backend: Any) -> str:
    table = f"bench_raw_{uuid.uuid4().hex[:8]}"
    backend.execute(
        f"CREATE TABLE IF NOT EXISTS {table} (event_id String, ts UInt64, avcc_code String, "
        "platform_node String, user_hash String, event_type String, duration_sec UInt32, "
        "revenue_cny Float64) ENGINE = MergeTree ORDER BY (avcc_code, ts)"
    )
    return table


def _sink_table(backend: Any) -> str:
    from app.playback.sink.store import PLAYBACK_TABLE, ensure_schema

    ensure_schema(backend)
    return PLAYBACK_TABLE


def run_raw(args: argparse.Namespace) -> dict[str, Any]:
    """Baseline: 8 columns into a plain MergeTree (the firehose's cheapest useful insert)."""
    return _raw_consume(args, "raw", _narrow_table, list(RAW_COLUMNS), _raw_narrow_rows)


def run_raw_sink(args: argparse.Namespace) -> dict[str, Any]:
    """Baseline: the sink's rows (same columns, unchecked) into the sink's own table, so the
    ratio measures the sink's loop rather than the cost of its table."""
    from app.playback.sink.store import PLAYBACK_INSERT_COLUMNS

    return _raw_consume(args, "raw_sink", _sink_table, list(PLAYBACK_INSERT_COLUMNS), _raw_sink_rows)


RUNNERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "sink": run_sink,
    "anomaly": run_anomaly,
    "faust": run_faust,
    "quix": run_quix,
    "raw": run_raw,
    "raw_sink": run_raw_sink,
}


def component_main(args: argparse.Namespace) -> int:
    """Measure one component in this process; its figure (ok or failed) on stdout."""
    figure = measure(args.component, lambda: RUNNERS[args.component](args))
    emit(figure)
    return 0 if is_ok(figure) else 1


# --- the gateway (a real faust worker) and its HTTP load --------------------------------------


async def post_batches(url: str, bodies: list[bytes], concurrency: int) -> tuple[int, float, float]:
    """POST every body (signed), sent again after a 503's wait (:func:`bench.client.settled`) and
    resending the refused items of a 429 after its ``Retry-After``; returns (accepted, first
    request time, last response time)."""
    import aiohttp

    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    accepted = 0
    first = last = 0.0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal accepted, first, last
        while not queue.empty():
            body = queue.get_nowait()
            if not first:
                first = time.perf_counter()
            send = partial(signed_call, session, url, "POST", ROUTE, body, KEY, SECRET, "application/json")
            answer = await settled(send)
            last = time.perf_counter()
            reply = answer.body
            if answer.status == 202:
                accepted += reply["accepted"]
                if reply["rejected"]:
                    raise RuntimeError(f"gateway rejected generated items: {reply['errors'][:3]}")
            elif answer.status == 429:
                items = orjson.loads(body)
                retry = items
                if "accepted" in reply:
                    accepted += reply["accepted"]
                    retry = [items[e["index"]] for e in reply.get("errors", [])] or items
                queue.put_nowait(orjson.dumps(retry))
                await asyncio.sleep(answer.retry_after_s)
            else:
                raise RuntimeError(f"gateway answered {answer.status}: {reply}")

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return accepted, first, last


def run_gateway(args: argparse.Namespace, items: list[dict[str, Any]]) -> dict[str, Any]:
    """One gateway run: ``items`` posted in signed batches, produced to the plan's playback topic
    (the bench's ``--topic``: the worker is configured as in production), once the worker
    reports ``/ready`` (its nonce store read)."""
    from testing.ports import free_port
    from testing.workers import group_worker

    port = free_port()
    env = {
        **os.environ,
        "AVCC_KAFKA_URL": f"kafka://{args.bootstrap}",
        "AVCC_HMAC_KEYS": json.dumps({KEY: SECRET}),
        "AVCC_GATEWAY_MAX_ITEMS": str(args.batch),
        "AVCC_LOG_LEVEL": "WARNING",
    }
    workdir = Path(args.workdir)
    worker = group_worker(
        "gateway",
        port=port,
        env=env,
        data_dir=workdir / "gateway",
        log_path=workdir / "gateway-worker.log",
        cwd=ROOT,
    )
    worker.start()
    try:
        pid = worker.pid
        assert pid is not None
        url = f"http://127.0.0.1:{port}"
        # warm-up: first request builds the producer and connects to the broker
        warm, _, _ = asyncio.run(post_batches(url, [orjson.dumps(items[:10])], 1))
        rest = items[10:]
        bodies = [orjson.dumps(rest[i : i + args.batch]) for i in range(0, len(rest), args.batch)]
        cpu0 = proc_cpu_s(pid)
        accepted, first, last = asyncio.run(post_batches(url, bodies, args.concurrency))
        # let the producer thread deliver what it queued (its CPU counts too)
        cpu1, previous = proc_cpu_s(pid), -1.0
        for _ in range(40):
            time.sleep(0.25)
            previous, cpu1 = cpu1, proc_cpu_s(pid)
            if cpu1 - previous < 0.01:
                break
        return result("gateway", accepted, last - first, previous - cpu0, warmup_events=warm)
    finally:
        worker.stop()


def spawn_component(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """Measure component ``name`` in a process of its own; its figure, failed when the process
    timed out or ended without one."""
    events = min(args.events, args.faust_events) if name == "faust" else args.events
    argv = [sys.executable, "-m", "bench.playback", "--component", name, "--bootstrap", args.bootstrap]
    argv += ["--events", str(events), "--workdir", args.workdir, "--topic", args.topic]
    argv += ["--anomaly-topic", args.anomaly_topic, "--dlq-topic", args.dlq_topic]
    argv += ["--timeout", str(args.timeout)]
    if args.clickhouse_url:
        argv += ["--clickhouse-url", args.clickhouse_url]
    log_path = Path(args.workdir) / f"{name}.log"
    with log_path.open("wb") as log:
        try:
            done = subprocess.run(
                argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, timeout=args.timeout + 60, check=False
            )
        except subprocess.TimeoutExpired:
            return failed(name, f"no figure within {args.timeout + 60:.0f} s")
    # (faust's spinner may put terminal escapes before the line)
    output = done.stdout.decode().splitlines()
    lines = [line.split(RESULT_PREFIX, 1)[1] for line in output if RESULT_PREFIX in line]
    if lines:
        return dict(json.loads(lines[-1]))
    tail = log_path.read_text(errors="replace").strip()
    print(f"# {name} exited {done.returncode} without a figure:\n{tail[-2000:]}", file=sys.stderr)
    last = tail.splitlines()[-1] if tail else "no output"
    return failed(name, f"exited {done.returncode} without a figure: {last}")


# --- orchestration ----------------------------------------------------------------------------


def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    """Create each topic of ``partitions`` (name -> partition count) with one replica."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(name, count, 1) for name, count in partitions.items()]
    for future in admin.create_topics(topics, operation_timeout=30).values():
        try:
            future.result(timeout=30)
        except KafkaException as exc:  # a --bootstrap broker of an earlier run has the plan's topic
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def median_run(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The measured run of ``name`` with the median events per CPU second (the lower middle one
    of an even count), with every measured run's figure beside it (and how many failed): one
    run's ratio moves by +-10 % on this box (chDB's background merges land in one window or the
    next), the median of a few far less. With no measured run, the last failure (or a failed
    figure saying there was no run)."""
    measured = [r for r in runs if is_ok(r)]
    if not measured:
        return runs[-1] if runs else failed(name, "not run")
    ordered = sorted(measured, key=lambda r: r["events_per_cpu_s"] or 0)
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        chosen["runs_events_per_cpu_s"] = [r["events_per_cpu_s"] for r in measured]
    if len(measured) < len(runs):
        chosen["failed_runs"] = len(runs) - len(measured)
    return chosen


def with_ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measured figure with ``x_baselines``: its events per CPU second over each measured
    baseline's (``raw``: 0.69 is 69 % of the bare client loop's)."""
    base = {r["name"]: r["events_per_cpu_s"] for r in results if r["name"] in BASELINES and is_ok(r)}
    out = []
    for r in results:
        mine = r.get("events_per_cpu_s")
        ratios = {b: round(mine / v, 2) for b, v in base.items() if b != r["name"] and mine and v}
        out.append({**r, "x_baselines": ratios} if ratios else r)
    return out


def table(results: list[dict[str, Any]]) -> str:
    """The figures as a text table, each measured one with its ratio to every measured baseline."""
    base = [b for b in BASELINES if any(r["name"] == b and is_ok(r) for r in results)]
    header = f"{'component':<9} {'events':>8} {'wall s':>7} {'cpu s':>7} {'ev/s':>8} {'ev/cpu-s':>9}"
    header += "".join(f" {'x ' + b:>8}" for b in base)
    lines = [header, "-" * len(header)]
    for r in results:
        if not is_ok(r):
            lines.append(f"{r['name']:<9} failed: {r['reason']}")
            continue
        line = (
            f"{r['name']:<9} {r['events']:>8} {r['wall_s']:>7.2f} {r['cpu_s']:>7.2f} "
            f"{r['events_per_s'] or 0:>8} {r['events_per_cpu_s'] or 0:>9}"
        )
        ratios = r.get("x_baselines", {})
        line += "".join(f" {ratios.get(b, 1.0 if b == r['name'] else 0.0):>8.2f}" for b in base)
        lines.append(line)
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    from app.platform.topics import ANOMALY, DLQ, PLAYBACK_EVENT

    selected = [c for c in COMPONENTS if c in set(args.only.split(","))] if args.only else list(COMPONENTS)
    workdir = Path(tempfile.mkdtemp(prefix="avcc-bench-"))
    args.workdir = str(workdir)
    u = uuid.uuid4().hex[:8]
    # the playback events go where the gateway worker produces them, the plan's topic (a run
    # with --bootstrap adds to what earlier runs left there; every component counts its own)
    args.topic = PLAYBACK_EVENT.name
    args.anomaly_topic, args.dlq_topic = (f"bench-{t}-{u}" for t in ("anomaly", "dlq"))
    if args.clickhouse_url:
        parsed = urlparse(args.clickhouse_url)
        if parsed.scheme == "clickhouse" and parsed.path.strip("/") == "":
            args.clickhouse_url = urlunparse(parsed._replace(path="/avcc_bench"))
    broker = None
    started = time.monotonic()
    try:
        if not args.bootstrap:
            from app.servers import KafkaKRaftBroker
            from testing.ports import free_port_block

            broker = KafkaKRaftBroker(workdir / "kafka", port=free_port_block((0, 1)), die_with_parent=True)
            broker.start()
            args.bootstrap = broker.bootstrap
            print(
                f"# embedded Kafka on {args.bootstrap}, ready in {broker.startup_seconds:.1f}s",
                file=sys.stderr,
            )
        create_topics(
            args.bootstrap,
            {
                args.topic: PLAYBACK_EVENT.partitions,
                args.anomaly_topic: ANOMALY.partitions,
                args.dlq_topic: DLQ.partitions,
            },
        )
        items = generate(args.events)
        results: list[dict[str, Any]] = []
        filled = False
        if "gateway" in selected:
            gateway_runs = [measure("gateway", partial(run_gateway, args, items))]
            for round_ in range(2, args.repeat + 1):
                print(f"# running gateway ({round_}/{args.repeat}) ...", file=sys.stderr)
                gateway_runs.append(measure("gateway", partial(run_gateway, args, items)))
            filled = all(is_ok(run) for run in gateway_runs)
            if filled:  # every round's events are on the topic: the components read them all
                args.events = sum(run["events"] + run.get("warmup_events", 0) for run in gateway_runs)
            results.append(median_run("gateway", gateway_runs))
        if not filled:  # no gateway run filled the topic: the same events produced straight to it
            fill_topic(args, items)
        print(f"# {args.events} events on {args.topic}", file=sys.stderr)
        runs: dict[str, list[dict[str, Any]]] = {}
        for round_ in range(1, args.repeat + 1):
            for name in selected:
                if name == "gateway":
                    continue
                print(f"# running {name} ({round_}/{args.repeat}) ...", file=sys.stderr)
                runs.setdefault(name, []).append(spawn_component(args, name))
        results = with_ratios(results + [median_run(name, each) for name, each in runs.items()])
        print(table(results))
        status = print_figures(results)
        kept = f"; logs in {workdir}" if args.keep else ""
        print(f"# total {time.monotonic() - started:.0f} s{kept}", file=sys.stderr)
        return status
    finally:
        if broker is not None:
            broker.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def fill_topic(args: argparse.Namespace, items: list[dict[str, Any]]) -> None:
    """Without the gateway: produce the same envelopes straight to the topic."""
    from confluent_kafka import Producer

    from bench.data import envelope

    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5, "batch.size": 65536})
    now = int(time.time() * 1000)
    for item in items:
        event_id = str(uuid.uuid4())
        while True:
            try:
                producer.produce(args.topic, envelope(item, now, event_id), event_id.encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--events", type=int, default=200_000, help="events to generate (default 200k)")
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap (default: embedded Kafka)")
    parser.add_argument("--clickhouse-url", default=None, help="clickhouse://host:port[/db] (default: chDB)")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(COMPONENTS)}")
    parser.add_argument(
        "--faust-events",
        type=int,
        default=50_000,
        help="events the faust baseline counts (the first N of the same data; default 50k: at ~4k "
        "events/CPU-s the full set alone would take minutes)",
    )
    parser.add_argument("--batch", type=int, default=2000, help="items per HTTP request (gateway)")
    parser.add_argument("--concurrency", type=int, default=4, help="HTTP requests in flight (gateway)")
    parser.add_argument("--timeout", type=float, default=240.0, help="per-component timeout, seconds")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each component after the gateway, in turns; the median run is reported",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, chDB data)")
    parser.add_argument("--component", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--anomaly-topic", help=argparse.SUPPRESS)
    parser.add_argument("--dlq-topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.component:
        return component_main(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
