"""State at scale: how fast a code worker with N works serves again after a kill, a lost disk or
the loss of its owner, next to the raw limit of the same changelogs.

1. **State**: an embedded Apache Kafka; ``--lifecycle`` works go through the real pipeline
   (bulk HTTP import, review, chain, code issued); the code group's changelogs are then filled to
   ``--records`` works copied from the issued ones (:mod:`bench.code_state` says how).
2. **Raw limit** (``recovery_raw``): a confluent-kafka consumer reads both changelogs into
   rocksdict stores, one per partition as the worker keeps them, through write batches.
3. **Cold rebuild** (``recovery_cold``): a code worker on an empty data dir: seconds from its
   start to ``/ready``, and changelog records per second while it said it was recovering.
4. **Warm restart** (``recovery_warm``): the same worker SIGKILLed and started again on its data
   dir: seconds to ``/ready``, to the first record served, and the changelog records it replayed.
5. **Standby failover** (``recovery_standby``): a second replica with
   ``AVCC_TABLE_STANDBY_REPLICAS=1``; once it holds a warm copy of the first one's partitions, the
   first is SIGKILLed: seconds until the second serves a record of each of them.
6. ``bytes_per_record``: the mean size of a ``records`` entry and of a whole work (both tables).

    python -m bench.recovery [--records 1000000] [--lifecycle 2000] [--bootstrap host:port]
                             [--skip standby,warm,...] [--worker-env AVCC_NAME=VALUE ...]

Prints one JSON line per figure (``recovery_cold`` with ``x_raw``, its rate over the raw limit's);
the progress goes to stderr. The code workers are static group members, as the StatefulSet pods
are, with the default session timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition
from rocksdict import Options, Rdict, WriteBatch

from app.platform.http.auth import sign_request
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.kafka.partitioner import partition_for
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, TOPIC_PLAN
from app.servers.kafka import KafkaKRaftBroker
from app.servers.process import ManagedProcess
from bench.bulk import bulk_import_figure
from bench.code_state import (
    CLAIMS_CHANGELOG,
    RECORDS_CHANGELOG,
    FilledWork,
    fill_changelogs,
    issued_templates,
    lifecycle_templates,
    read_changelog,
    synthetic_works,
)
from bench.figures import is_ok, measure, print_figures
from bench.options import add_worker_env, worker_env
from testing.ports import free_port, free_port_block
from testing.processes import stop_together
from testing.workers import group_worker

KEY, SECRET = "bench", "bench-secret-0123456789"
ROOT = Path(__file__).resolve().parents[1]
LIFECYCLE_GROUPS = ("code", "review", "chain", "settlement")
#: Longest a worker may take to be ready: a cold rebuild of a million works takes about 25 s.
READY_TIMEOUT_S = 1800.0
CHANGELOGS = (RECORDS_CHANGELOG, CLAIMS_CHANGELOG)


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"# {message}", file=sys.stderr, flush=True)


def http_json(url: str, *, signed: bool = False, timeout: float = 5.0) -> tuple[int, Any]:
    """``GET url``: its status and decoded body (``(0, None)`` when nothing answers)."""
    headers = {}
    if signed:
        path = "/" + url.split("/", 3)[3]
        headers = dict(sign_request("GET", path, b"", KEY, SECRET))
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            return error.code, orjson.loads(body)
        except orjson.JSONDecodeError:
            return error.code, body.decode(errors="replace")
    except (OSError, orjson.JSONDecodeError):
        return 0, None


class Workers:
    """Worker processes of the bench, each on its own loopback address and data dir, ready once
    their ``/ready`` answers 200."""

    def __init__(self, bootstrap: str, work: Path, env: dict[str, str]) -> None:
        self.work = work
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AVCC_")},
            "AVCC_KAFKA_URL": f"kafka://{bootstrap}",
            "AVCC_HMAC_KEYS": json.dumps({KEY: SECRET}),
            "AVCC_BLOCK_INTERVAL_MS": "100",
            "AVCC_LOG_LEVEL": "INFO",
            **env,
        }
        self.ports = {group: free_port() for group in LIFECYCLE_GROUPS}
        self.processes: dict[str, ManagedProcess] = {}

    @staticmethod
    def host(name: str) -> str:
        """The loopback address worker ``name`` (``<group>-<index>``) listens on: one per replica."""
        return f"127.0.0.{int(name.rsplit('-', 1)[1]) + 1}"

    def url(self, name: str) -> str:
        """Base URL of worker ``name``."""
        return f"http://{self.host(name)}:{self.ports[name.rsplit('-', 1)[0]]}"

    def data_dir(self, name: str) -> Path:
        """The data dir of worker ``name``."""
        return self.work / name

    def process(self, name: str, env: dict[str, str] | None = None) -> ManagedProcess:
        """Worker ``name``, created on first use with ``env`` on top (a stopped worker given
        ``env`` is created anew with it)."""
        existing = self.processes.get(name)
        if existing is not None and env is not None and not existing.running:
            del self.processes[name]
        if name not in self.processes:
            group = name.rsplit("-", 1)[0]
            self.processes[name] = group_worker(
                group,
                port=self.ports[group],
                env={**self.env, **(env or {})},
                data_dir=self.data_dir(name),
                log_path=self.work / f"{name}.log",
                host=self.host(name),
                name=name,
                cwd=ROOT,
                ready_timeout=READY_TIMEOUT_S,
            )
        return self.processes[name]

    def start(self, *names: str) -> None:
        """Start workers ``names`` together and wait until each is ready."""
        for name in names:
            self.process(name).start(wait=False)
        for name in names:
            self.process(name).wait_ready()

    def stop_all(self) -> None:
        """Stop every worker still running."""
        stop_together(p for p in self.processes.values() if p.running)


def run_lifecycle(bootstrap: str, work: Path, env: dict[str, str], works: int) -> None:
    """``works`` O-level works through the real pipeline, until each is issued."""
    workers = Workers(bootstrap, work / "lifecycle", env)
    try:
        workers.start(*(f"{group}-0" for group in LIFECYCLE_GROUPS))
        figure = bulk_import_figure(workers.url("code-0"), works, workers.work, KEY, SECRET)
        log(f"lifecycle: {figure}")
        if figure["issued"] != works:
            raise RuntimeError(f"lifecycle: {figure['issued']} of {works} works issued")
    finally:
        workers.stop_all()


def changelog_ends(bootstrap: str, topics: tuple[str, ...]) -> dict[tuple[str, int], tuple[int, int]]:
    """``(low, high)`` watermarks of every partition of ``topics``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        ends = {}
        for topic in topics:
            for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
                ends[(topic, p)] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        return ends
    finally:
        consumer.close()


def raw_restore(bootstrap: str, target: Path) -> dict[str, Any]:
    """The raw limit: read both changelogs to their ends into one rocksdict per partition under
    ``target`` (removed afterwards), 10,000 messages a fetch, one write batch per partition and
    fetch."""
    target.mkdir(parents=True, exist_ok=True)
    ends = {tp: high for tp, (low, high) in changelog_ends(bootstrap, CHANGELOGS).items() if high > low}
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-raw",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 16 << 20,
        }
    )
    options = Options(raw_mode=True)
    stores = {tp: Rdict(str(target / f"{tp[0]}-{tp[1]}"), options) for tp in ends}
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for topic, p in ends])
    pending = set(ends)
    records = 0
    while pending:
        batches: dict[tuple[str, int], WriteBatch] = {}
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error():
                continue
            tp = (message.topic(), message.partition())
            batch = batches.get(tp)
            if batch is None:
                batch = batches[tp] = WriteBatch(raw_mode=True)
            value = message.value()
            if value is None:
                batch.delete(message.key())
            else:
                batch.put(message.key(), value)
            records += 1
            if message.offset() + 1 >= ends[tp]:
                pending.discard(tp)
        for tp, batch in batches.items():
            stores[tp].write(batch)
    seconds = time.perf_counter() - started
    consumer.close()
    for store in stores.values():
        store.close()
    shutil.rmtree(target)
    return {
        "name": "recovery_raw",
        "records": records,
        "seconds": round(seconds, 2),
        "records_per_s": round(records / seconds),
    }


def metric_sum(url: str, name: str) -> float | None:
    """The sum of every series of metric ``name`` at ``url/metrics`` (``None``: not exported)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and (line[len(name)] in "{ ")
    ]
    return sum(values) if values else None


def first_served(url: str, samples: list[FilledWork], timeout: float = 600.0) -> float:
    """Seconds until ``url`` serves one of ``samples`` with its code (from now)."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        for work in samples[:20]:
            status, body = http_json(f"{url}/v1/avcc/records/{work.record_id}", signed=True, timeout=2)
            if status == 200 and isinstance(body, dict):
                if body.get("avcc_code") != work.avcc_code:
                    raise AssertionError(
                        f"record {work.record_id}: code {body.get('avcc_code')} != {work.avcc_code}"
                    )
                return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(f"{url} served none of the sampled records within {timeout:.0f} s")


def cold_rebuild(workers: Workers, name: str, changelog_records: int, works: int) -> dict[str, Any]:
    """Start worker ``name`` on an empty data dir; its rebuild figure: seconds from its start
    to ``/ready``, and the restore's own records and seconds (its metrics) with their rate."""
    shutil.rmtree(workers.data_dir(name), ignore_errors=True)
    started = time.monotonic()
    workers.start(name)
    ready_s = time.monotonic() - started
    url = workers.url(name)
    restored = metric_sum(url, "avcc_table_recovery_last_records")
    seconds = metric_sum(url, "avcc_table_recovery_last_seconds")
    rate = round(restored / seconds) if restored and seconds else None
    return {
        "name": "recovery_cold",
        "records": works,
        "changelog_records": changelog_records,
        "restored": int(restored) if restored is not None else None,
        "ready_s": round(ready_s, 2),
        "restore_s": round(seconds, 2) if seconds is not None else None,
        "records_per_s": rate,
    }


def warm_restart(workers: Workers, name: str, works: int, samples: list[FilledWork]) -> dict[str, Any]:
    """SIGKILL worker ``name`` and start it again on its data dir; its restart figure."""
    if not workers.process(name).running:
        workers.start(name)
    workers.process(name).kill()
    started = time.monotonic()
    workers.start(name)
    ready_s = time.monotonic() - started
    served_s = ready_s + first_served(workers.url(name), samples)
    replayed = metric_sum(workers.url(name), "avcc_table_recovery_replayed_records")
    return {
        "name": "recovery_warm",
        "records": works,
        "ready_s": round(ready_s, 2),
        "first_served_s": round(served_s, 2),
        "replayed": int(replayed) if replayed is not None else None,
    }


def samples_by_partition(bootstrap: str, per_partition: int = 5) -> dict[int, list[tuple[int, str]]]:
    """A few ``(record id, code)`` of every ``records`` partition, read from its changelog."""
    found: dict[int, list[tuple[int, str]]] = {}
    for key, value in read_changelog(bootstrap, RECORDS_CHANGELOG).items():
        record = orjson.loads(value)
        partition = partition_for(key, APPLY_CREATED.partitions)
        if record.get("avcc_code") and len(found.setdefault(partition, [])) < per_partition:
            found[partition].append((record["avcc_record_id"], record["avcc_code"]))
    return found


def served_partitions(url: str, samples: dict[int, list[tuple[int, str]]]) -> set[int]:
    """The partitions of which ``url`` serves a sampled record, with its code."""
    served = set()
    for partition, records in samples.items():
        record_id, code = records[0]
        status, body = http_json(f"{url}/v1/avcc/records/{record_id}", signed=True, timeout=3)
        if status == 200 and isinstance(body, dict) and body.get("avcc_code") == code:
            served.add(partition)
    return served


def standby_failover(workers: Workers, bootstrap: str) -> dict[str, Any]:
    """Two code replicas with standbys; the first SIGKILLed once the second holds a warm copy of
    its partitions: seconds until the second serves a record of every partition, and how many
    changelog records it had to restore meanwhile."""
    standby = {"AVCC_TABLE_STANDBY_REPLICAS": "1"}
    samples = samples_by_partition(bootstrap)
    owner, survivor = "code-0", "code-1"
    workers.process(owner).stop()
    shutil.rmtree(workers.data_dir(survivor), ignore_errors=True)
    for name in (owner, survivor):
        workers.process(name, {**standby, "AVCC_KAFKA_GROUP_INSTANCE_ID": name})
    workers.start(owner, survivor)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        lags = [metric_sum(workers.url(n), "avcc_table_standby_lag_records") for n in (owner, survivor)]
        if all(lag == 0 for lag in lags):
            break
        time.sleep(0.5)
    else:
        raise TimeoutError(f"standbys never caught up: {lags}")
    restored_before = metric_sum(workers.url(survivor), "avcc_table_recovery_replayed_records") or 0.0
    workers.process(owner).kill()
    killed = time.monotonic()
    while len(served_partitions(workers.url(survivor), samples)) < len(samples):
        if time.monotonic() - killed > 600:
            raise TimeoutError("the survivor did not serve every partition within 600 s")
        time.sleep(0.1)
    seconds = time.monotonic() - killed
    restored_after = metric_sum(workers.url(survivor), "avcc_table_recovery_replayed_records") or 0.0
    return {
        "name": "recovery_standby",
        "seconds": round(seconds, 2),
        "replayed_at_failover": int(restored_after - restored_before),
        "session_timeout_ms": Settings().kafka_session_timeout_ms,
    }


def bytes_per_record(bootstrap: str, works: int) -> dict[str, Any]:
    """Mean bytes of a ``records`` value (its key included) and of a whole work, from the
    changelogs as read back (a sample of the first 200,000 entries of each)."""
    sizes: dict[str, float] = {}
    for topic in CHANGELOGS:
        latest = read_changelog(bootstrap, topic)
        entries = list(latest.items())[:200_000]
        sizes[topic] = sum(len(k) + len(v) for k, v in entries) / max(len(entries), 1)
    return {
        "name": "bytes_per_record",
        "records": works,
        "record_bytes": round(sizes[RECORDS_CHANGELOG]),
        "work_bytes": round(sizes[RECORDS_CHANGELOG] + sizes[CLAIMS_CHANGELOG]),
    }


def build_state(
    bootstrap: str, work: Path, env: dict[str, str], records: int, lifecycle: int
) -> list[FilledWork]:
    """The code group's changelogs filled to ``records`` works (see the module doc); a sample of
    the works filled."""
    settings = Settings(kafka_url=f"kafka://{bootstrap}")
    apply_plan(settings, [*TOPIC_PLAN, *changelog_specs()])
    if lifecycle > 0:
        run_lifecycle(bootstrap, work, env, lifecycle)
        templates = issued_templates(read_changelog(bootstrap, RECORDS_CHANGELOG))
    else:
        templates = lifecycle_templates(50, settings.avcc_org, settings.avcc_node)
    started = time.monotonic()
    works = synthetic_works(templates, max(0, records - lifecycle), settings.avcc_org, settings.avcc_node)
    filled, samples = fill_changelogs(bootstrap, works)
    log(f"filled {filled} works from {len(templates)} templates in {time.monotonic() - started:.1f} s")
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000, help="works the code group holds")
    parser.add_argument(
        "--lifecycle",
        type=int,
        default=2000,
        help="works issued through the real pipeline first (0: templates from the code group's own "
        "transitions, without running the pipeline)",
    )
    parser.add_argument(
        "--bootstrap", default=None, help="use this (empty) broker instead of an embedded Kafka"
    )
    parser.add_argument("--skip", default="", help="figures not to measure: raw,cold,warm,standby")
    add_worker_env(parser)
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, data) at the end")
    args = parser.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    env = worker_env(args)
    work = Path(tempfile.mkdtemp(prefix="avcc-bench-recovery-"))
    log(f"work dir {work}")
    broker = None
    if args.bootstrap is None:
        broker = KafkaKRaftBroker(work / "kafka", port=free_port_block((0, 1)), die_with_parent=True)
        broker.start()
        bootstrap = broker.bootstrap
    else:
        bootstrap = args.bootstrap
    # the code worker runs as a StatefulSet pod does: a stable group instance id (static membership)
    workers = Workers(bootstrap, work, {"AVCC_KAFKA_GROUP_INSTANCE_ID": "code-0", **env})
    figures: list[dict[str, Any]] = []

    def add(name: str, produce: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        figure = measure(name, produce)
        log(json.dumps(figure))
        figures.append(figure)
        return figure

    try:
        samples = build_state(bootstrap, work, env, args.records, args.lifecycle)
        changelog_records = sum(high - low for low, high in changelog_ends(bootstrap, CHANGELOGS).values())
        log(f"changelogs hold {changelog_records} records")
        raw: dict[str, Any] = {}
        if "raw" not in skip:
            raw = add("recovery_raw", lambda: raw_restore(bootstrap, work / "raw"))
        if "cold" not in skip:
            cold = add(
                "recovery_cold", lambda: cold_rebuild(workers, "code-0", changelog_records, args.records)
            )
            if is_ok(raw) and raw and is_ok(cold) and cold.get("records_per_s"):
                cold["x_raw"] = round(cold["records_per_s"] / raw["records_per_s"], 2)
        if "warm" not in skip:
            add("recovery_warm", lambda: warm_restart(workers, "code-0", args.records, samples))
        if "standby" not in skip:
            add("recovery_standby", lambda: standby_failover(workers, bootstrap))
        add("bytes_per_record", lambda: bytes_per_record(bootstrap, args.records))
        return print_figures(figures)
    finally:
        workers.stop_all()
        if broker is not None:
            broker.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
