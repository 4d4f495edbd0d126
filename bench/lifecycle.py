"""Latency from HTTP apply to AVCC code issued, for O-level works, on the local stack.

Starts an embedded Apache Kafka broker and the code/review/chain/settlement workers (block interval
100 ms), measures the broker round trip (produce -> consume of one message) as the baseline,
then submits N signed O-level applications at a steady rate and reads, from each record's
history, when its code was issued. Prints p50/p99 and one JSON line per figure, and beside them
what the code worker's own ``avcc_time_to_code_seconds`` histogram counted for the same
applications (scraped from its ``/metrics`` before and after; quantiles as Prometheus's
``histogram_quantile`` reads them): the server-side figure starts at the application's acceptance
by the claims agent, the client's at its request, so the two differ by the claim's hop.

Then it finds the knee itself: it steps the rate up (``--knee-rates``, ``--knee-seconds`` per
step) and reports the highest rate whose p99 apply -> code issued stays under 1 s
(``lifecycle_max_rate``); and it imports ``--bulk`` works through the bulk route the way
``avcc import`` does (``bulk_import``: applications accepted per second, and issued per second).

    python -m bench.lifecycle [--applications 1000] [--rate 20] [--bootstrap host:port]
                              [--knee-rates 25,50,...] [--knee-seconds 10] [--bulk 100000]
                              [--worker-env AVCC_NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from app.ops.slo.report import histogram_quantile
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.metrics import TIME_TO_CODE_BUCKETS
from app.platform.settings import Settings
from app.platform.topics import TOPIC_PLAN
from app.servers.kafka import KafkaKRaftBroker
from app.servers.process import ManagedProcess
from bench.bulk import bulk_import_figure
from bench.client import settled, signed_call
from bench.cpu import CpuSampler, CpuShare
from bench.data import o_level_application
from bench.figures import is_ok, measure, print_figures
from bench.options import add_worker_env, worker_env
from bench.profiles import summarize
from bench.scrape import Scrape, scrape
from testing.ports import free_port, free_port_block
from testing.processes import start_together
from testing.workers import group_worker

GROUPS = ("code", "review", "chain", "settlement")
KEY, SECRET = "bench", "bench-secret-0123456789"
ROOT = Path(__file__).resolve().parents[1]
#: The knee: the highest rate whose p99 apply -> code issued stays under this.
KNEE_P99_MS = 1000.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def latency_figure(name: str, latencies: Callable[[], list[float]]) -> dict[str, Any]:
    """The figure ``name`` of the latencies (ms) ``latencies()`` measures: p50, p99 and mean;
    failed when it raised or measured none."""

    def figure() -> dict[str, Any]:
        values = latencies()
        if not values:
            raise ValueError("no latency measured")
        return {
            "name": name,
            "n": len(values),
            "p50_ms": round(percentile(values, 50), 2),
            "p99_ms": round(percentile(values, 99), 2),
            "mean_ms": round(statistics.fmean(values), 2),
            "block_interval_ms": 100,
        }

    return measure(name, figure)


def broker_round_trip(bootstrap: str, samples: int = 200) -> list[float]:
    """Produce (acks=all, idempotent) -> consume latency of single messages, in ms."""
    topic = f"bench-rtt-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0}
    )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": topic,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.subscribe([topic])
    while not consumer.assignment():
        consumer.poll(0.1)
    latencies: list[float] = []
    for _ in range(samples):
        started = time.perf_counter()
        producer.produce(topic, b"x")
        producer.flush()
        while (msg := consumer.poll(1.0)) is None or msg.error():
            pass
        latencies.append((time.perf_counter() - started) * 1000)
    consumer.close()
    return latencies


#: Time (ms) from each application's request to its 202 answer, of the latest run.
ANSWERED_MS: list[float] = []


async def run_applications(
    base: str, count: int, rate: float, submitted: Callable[[], None] | None = None
) -> list[float]:
    """Submit ``count`` O-level applications at ``rate``/s; latency (ms) to code issued each.
    ``submitted`` is called once every application was accepted (before their codes are read);
    how long each took to be answered goes to :data:`ANSWERED_MS`."""
    sent: dict[int, float] = {}
    ANSWERED_MS.clear()
    path = "/v1/avcc/applications"
    async with aiohttp.ClientSession() as session:

        async def apply_one() -> None:
            body = orjson.dumps(o_level_application())
            started_ms = time.time() * 1000
            # a 503 (e.g. "claim not answered") is sent again, same request_id, once its wait is over
            answer = await settled(partial(signed_call, session, base, "POST", path, body, KEY, SECRET))
            if answer.status != 202:
                raise RuntimeError(f"apply failed: {answer.status} {answer.body}")
            sent[answer.body["avcc_record_id"]] = started_ms
            ANSWERED_MS.append(time.time() * 1000 - started_ms)

        tasks = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(count):  # on an absolute schedule, so sleep overheads do not lower the rate
            tasks.append(asyncio.create_task(apply_one()))
            await asyncio.sleep(max(0.0, start + (i + 1) / rate - loop.time()))
        await asyncio.gather(*tasks)
        if submitted is not None:
            submitted()

        latencies: list[float] = []
        deadline = time.monotonic() + 120
        pending = dict(sent)
        while pending and time.monotonic() < deadline:
            for record_id, started_ms in list(pending.items()):
                p = f"/v1/avcc/records/{record_id}"
                answer = await settled(partial(signed_call, session, base, "GET", p, b"", KEY, SECRET))
                if answer.status != 200:
                    continue
                issued = [h["at_ms"] for h in answer.body["history"] if h["status"] == "issued"]
                if issued:
                    latencies.append(issued[0] - started_ms)
                    del pending[record_id]
            await asyncio.sleep(0.5)
        if pending:
            print(f"WARNING: {len(pending)} applications not issued within 120 s", file=sys.stderr)
    return latencies


def knee_step(base: str, rate: float, seconds: float) -> tuple[list[float], bool]:
    """One step of the knee search: ``rate``/s for ``seconds``; the latencies, and whether every
    application was accepted and issued with p99 under :data:`KNEE_P99_MS`."""
    count = max(1, round(rate * seconds))
    try:
        latencies = asyncio.run(run_applications(base, count, rate))
    except RuntimeError as exc:  # e.g. still refused after a minute of 503s: past the knee
        print(f"rate {rate:g}/s: {exc}", file=sys.stderr)
        return [], False
    held = len(latencies) == count and percentile(latencies, 99) < KNEE_P99_MS
    return latencies, held


def find_knee(base: str, rates: list[float], seconds: float) -> dict[str, Any]:
    """Step the rate up through ``rates`` until p99 apply -> code reaches 1 s (or applications
    fail); the ``lifecycle_max_rate`` figure of the highest step that held."""
    best: dict[str, Any] = {"name": "lifecycle_max_rate", "rate_per_s": 0, "p50_ms": None, "p99_ms": None}
    for rate in rates:
        latencies, held = knee_step(base, rate, seconds)
        p50 = round(percentile(latencies, 50), 2) if latencies else None
        p99 = round(percentile(latencies, 99), 2) if latencies else None
        print(
            f"knee step {rate:>7g}/s: n={len(latencies)} p50={p50} ms p99={p99} ms held={held}",
            file=sys.stderr,
        )
        if not held:
            break
        best = {"name": "lifecycle_max_rate", "rate_per_s": rate, "p50_ms": p50, "p99_ms": p99}
    return best


@contextlib.contextmanager
def py_spy(pids: dict[str, int], out: Path | None, seconds: float) -> Iterator[None]:
    """Record a py-spy flamegraph of each of ``pids`` into ``out`` for ``seconds`` (from the
    start of the block) while the block runs."""
    recorders: list[subprocess.Popen[bytes]] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).with_name("py-spy")
        for name, pid in pids.items():
            command = [str(spy), "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100"]
            command += ["--nonblocking", "-f", "raw", "-o", str(out / f"{name}.folded")]
            recorders.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.wait()
        if out is not None:
            for name in pids:
                print(f"\npy-spy, {name} worker (% of its busy samples):", file=sys.stderr)
                for line in summarize(out / f"{name}.folded"):
                    print(f"  {line}", file=sys.stderr)


#: The code worker's histograms of the time from an application to its final answer, and per stage.
TIME_TO_CODE = "avcc_time_to_code_seconds"
TIME_TO_CODE_STAGE = "avcc_time_to_code_stage_seconds"


def time_to_code_figure(buckets: list[float]) -> dict[str, Any]:
    """The O-level applications' time to code as the code worker's histogram counted them (its
    cumulative ``buckets``, ``+Inf`` last): p50/p99 interpolated as Prometheus does."""
    bounds = list(TIME_TO_CODE_BUCKETS)
    p50, p99 = (histogram_quantile(q, bounds, buckets) for q in (0.5, 0.99))
    return {
        "name": "time_to_code_o_level_histogram",
        "n": int(buckets[-1]),
        "p50_ms": round(1000 * p50, 2) if p50 is not None else None,
        "p99_ms": round(1000 * p99, 2) if p99 is not None else None,
    }


def stage_means_ms(before: Scrape, after: Scrape) -> dict[str, float]:
    """Mean milliseconds the O-level applications answered between two scrapes spent per stage."""
    means = {}
    for stage in ("code", "review", "chain"):
        spent, count = (
            after.change(before, f"{TIME_TO_CODE_STAGE}_{part}", level="O", stage=stage)
            for part in ("sum", "count")
        )
        if count:
            means[stage] = round(1000 * spent / count, 1)
    return means


def print_stages(base: str) -> None:
    """The code worker's mean time per stage of a signed request (``avcc_request_stage_seconds``)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for suffix, into in (("_sum", sums), ("_count", counts)):
            prefix = f"avcc_request_stage_seconds{suffix}{{"
            if line.startswith(prefix):
                stage = line.split('stage="', 1)[1].split('"', 1)[0]
                into[stage] = float(line.rsplit(" ", 1)[1])
    for stage, count in counts.items():
        mean = 1000 * sums.get(stage, 0.0) / max(count, 1)
        print(f"  code worker stage {stage}: {count:.0f} times, mean {mean:.1f} ms", file=sys.stderr)


def cpu_profile(base: str, pids: dict[str, int], rate: float, seconds: float) -> dict[str, Any]:
    """Apply at ``rate``/s for ``seconds`` and print each process's CPU per application while the
    applications were submitted (the pipeline keeps up at a rate below its knee, so this is
    what an application costs each process; reading the codes back afterwards is not counted)."""
    count = max(1, round(rate * seconds))
    shares: list[CpuShare] = []
    sampler = CpuSampler(pids)
    asyncio.run(run_applications(base, count, rate, lambda: shares.extend(sampler.stop(count))))
    print(f"\nCPU at {rate:g} applications/s ({count} applications):", file=sys.stderr)
    for share in shares:
        cost = f"{share.core_percent:6.1f} % of a core  {share.ms_per_unit:6.2f} ms/application"
        print(f"  {share.name:16} {cost}", file=sys.stderr)
    total = sum(share.ms_per_unit for share in shares)
    print(f"  {'total':16} {'':>20}  {total:6.2f} ms/application", file=sys.stderr)
    elapsed = shares[0].seconds if shares else 0.0
    print(
        f"  submitted at {count / max(elapsed, 1e-9):.0f}/s; answered in p50 "
        f"{percentile(ANSWERED_MS, 50):.0f} ms, p99 {percentile(ANSWERED_MS, 99):.0f} ms",
        file=sys.stderr,
    )
    return {
        "name": "cpu_per_application",
        "rate_per_s": rate,
        "applications": count,
        "ms": {share.name: round(share.ms_per_unit, 2) for share in shares},
        "total_ms": round(total, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--applications", type=int, default=1000)
    parser.add_argument(
        "--rate",
        type=float,
        default=20.0,
        help="applications per second (the core groups hold p99 < 1 s up to about 100/s on 2 cores)",
    )
    parser.add_argument("--bootstrap", default=None, help="use this broker instead of an embedded Kafka")
    parser.add_argument(
        "--knee-rates",
        default="25,50,100,150,200,300,400,600",
        help="rates (applications/s) the knee search steps through, ascending; empty: no search",
    )
    parser.add_argument("--knee-seconds", type=float, default=10.0, help="length of one knee step")
    parser.add_argument(
        "--bulk", type=int, default=100_000, help="applications of the bulk import figure (0: none)"
    )
    parser.add_argument(
        "--cpu-rate",
        type=float,
        default=100.0,
        help="applications per second of the CPU profile (per-process CPU per application); 0: none",
    )
    parser.add_argument("--cpu-seconds", type=float, default=20.0, help="length of the CPU profile")
    parser.add_argument("--broker-pid", type=int, default=None, help="pid of a --bootstrap broker to profile")
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="also record a py-spy profile of each worker during the CPU profile (collapsed stacks, "
        "DIR/<group>.folded) and print where each worker's time goes",
    )
    add_worker_env(parser)
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, broker data)")
    args = parser.parse_args()
    extra_env = worker_env(args)

    work = Path(tempfile.mkdtemp(prefix="avcc-bench-"))
    broker = None
    if args.bootstrap is None:
        broker = KafkaKRaftBroker(work / "kafka", port=free_port_block((0, 1)), die_with_parent=True)
        broker.start()
        bootstrap = broker.bootstrap
        print(f"# embedded Kafka on {bootstrap}, ready in {broker.startup_seconds:.1f}s", file=sys.stderr)
    else:
        bootstrap = args.bootstrap
    workers: list[ManagedProcess] = []
    try:
        settings = Settings(kafka_url=f"kafka://{bootstrap}")
        apply_plan(settings, [*TOPIC_PLAN, *changelog_specs()])
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AVCC_")},
            "AVCC_KAFKA_URL": f"kafka://{bootstrap}",
            "AVCC_HMAC_KEYS": json.dumps({KEY: SECRET}),
            "AVCC_BLOCK_INTERVAL_MS": "100",
            "AVCC_LOG_LEVEL": "WARNING",
            "AVCC_KAFKA_SESSION_TIMEOUT_MS": "6000",
            **extra_env,
        }
        ports = {group: free_port() for group in GROUPS}
        workers = [
            group_worker(
                group,
                port=ports[group],
                env=env,
                data_dir=work / group,
                log_path=work / f"{group}.log",
                cwd=ROOT,
            )
            for group in GROUPS
        ]
        start_together(workers)

        base = f"http://127.0.0.1:{ports['code']}"
        rtt = latency_figure("broker_round_trip", lambda: broker_round_trip(bootstrap))
        asyncio.run(run_applications(base, 20, 20))  # warm-up
        before = scrape(base)
        issued = latency_figure(
            "apply_to_code_issued_o_level",
            lambda: asyncio.run(run_applications(base, args.applications, args.rate)),
        )
        after = scrape(base)
        served = measure(
            "time_to_code_o_level_histogram",
            lambda: {
                **time_to_code_figure(
                    after.since(before, TIME_TO_CODE, level="O", outcome="issued", review="ai")
                ),
                "stage_mean_ms": stage_means_ms(before, after),
            },
        )
        cpu = None
        if args.cpu_rate > 0:
            pids = {worker.name: worker.pid for worker in workers if worker.pid is not None}
            broker_pid = broker.pid if broker is not None else args.broker_pid
            if broker_pid is not None:
                pids["broker"] = broker_pid
            pids["load generator"] = os.getpid()
            profiles = {w.name: w.pid for w in workers if w.pid is not None} if args.py_spy else {}
            with py_spy(profiles, args.py_spy, args.cpu_seconds):
                cpu = measure(
                    "cpu_per_application", lambda: cpu_profile(base, pids, args.cpu_rate, args.cpu_seconds)
                )
            print_stages(base)
        rates = [float(r) for r in args.knee_rates.split(",") if r.strip()]
        knee = bulk = None
        if rates:
            knee = measure("lifecycle_max_rate", lambda: find_knee(base, rates, args.knee_seconds))
        if args.bulk > 0:
            bulk = measure("bulk_import", lambda: bulk_import_figure(base, args.bulk, work, KEY, SECRET))
        print(f"\n{'figure':34} {'n':>6} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9}")
        for figure in (rtt, issued):
            if is_ok(figure):
                print(
                    f"{figure['name']:34} {figure['n']:>6} {figure['p50_ms']:>9.1f} {figure['p99_ms']:>9.1f} "
                    f"{figure['mean_ms']:>9.1f}"
                )
        if is_ok(served):
            print(
                f"{'  the same, code worker histogram':34} {served['n']:>6} {served['p50_ms']:>9.1f} "
                f"{served['p99_ms']:>9.1f}   per stage (mean ms): {served['stage_mean_ms']}"
            )
        return print_figures(f for f in (rtt, issued, served, knee, bulk, cpu) if f is not None)
    finally:
        for worker in workers:
            worker.stop()
        if broker is not None:
            broker.stop()
        if args.keep:
            print(f"# logs in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
