"""Fault injection on real brokers: in-process backoff, the retry topic and its forwarder, the DLQ,
poison messages, and per-key order while an event waits in the retry path.

Each test starts one faust worker subprocess (a tiny app written below) whose agent runs
``GroupRuntime.consume`` with a handler steered by the event's ``request_id`` prefix:

* ``failN-...``   raise ``DependencyTimeout`` on the first N attempts, then succeed,
* ``always-...``  always raise ``DependencyTimeout``,
* ``broken-...``  raise while the file ``<out>/broken`` exists (the console test "fixes" it),
* anything else   succeed.

The worker also runs a :class:`app.ops.retry.forwarder.RetryForwarder` limited to the test's group (the
retry and DLQ topics are the plan's, shared by every test, so a unique app id / group per test
and filtering by event id or original topic keep tests apart). The worker logs every attempt
and every applied event to ``<out>/events.jsonl``.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from app.platform.kafka.admin import apply_plan
from app.platform.kafka.partitioner import partition_for, record_key
from app.platform.settings import Settings
from app.platform.topics import DLQ, RETRY
from schemas.apply import AiToolInfo, ApplyCreated
from schemas.envelope import encode_event, make_envelope
from schemas.system import FailureMetadata
from tests.integration.reads import end_offsets, read_range, read_to_sentinel, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPO_ROOT = Path(__file__).resolve().parents[2]
BACKOFF_S = (0.2, 0.4, 0.8)
TOPIC_DELAY_S = 2.0
#: How much earlier than its delay a measured gap may end: asyncio wakes a sleep up to one clock
#: resolution early, and a header's not-before is in whole milliseconds. Gaps have no upper bound
#: (a loaded box may take any time); how long the test waits for the events is its deadline.
CLOCK_SLACK_S = 0.005
#: How long a test waits for the worker to get somewhere (its start included, for the first test).
DEADLINE_S = 90.0
PARTITIONS = 3

WORKER_SOURCE = r'''
"""Fault-injection worker of tests/integration/test_faults.py (generated)."""
import os
import time
from pathlib import Path

import orjson

from app.ops.retry.forwarder import RetryForwarder
from app.platform.faust.own_consumer import OwnConsumerService
from app.platform.errors import DependencyTimeout
from app.platform.faust.app import create_app
from testing.ports import free_port
from app.platform.faust.runtime import Effects, GroupRuntime
from app.platform.settings import get_settings
from app.platform.topics import APPLY_CREATED

settings = get_settings()
APP_ID = os.environ["FAULTS_APP_ID"]
TOPIC = os.environ["FAULTS_TOPIC"]
GROUP = os.environ["FAULTS_GROUP"]
OUT = Path(os.environ["FAULTS_OUT"])
PARTS = int(os.environ["FAULTS_PARTITIONS"])

app = create_app(
    APP_ID,
    datadir=OUT / "faust",
    web_port=free_port(),
    reply_to=f"{APP_ID}-replies",
    topic_allow_declare=True,
    broker_commit_interval=0.5,
)
source = app.topic(
    TOPIC,
    partitions=PARTS,
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
    acks=False,
)
runtime = GroupRuntime(GROUP, "faults-svc", app)
parking = runtime.parking_table("faults", PARTS)

attempts: dict[str, int] = {}
applied: set[str] = set()


def record(kind: str, **fields: object) -> None:
    line = orjson.dumps({"kind": kind, "t": time.monotonic(), **fields}) + b"\n"
    with open(OUT / "events.jsonl", "ab") as f:
        f.write(line)


async def handler(envelope):
    event_id = str(envelope.event_id)
    request_id = envelope.payload.request_id
    if event_id in applied:
        return Effects(duplicate=True)
    n = attempts[event_id] = attempts.get(event_id, 0) + 1
    record("attempt", event_id=event_id, request_id=request_id, n=n)
    mode = request_id.split("-", 1)[0]
    if mode.startswith("fail") and n <= int(mode[4:]):
        raise DependencyTimeout(f"dependency timed out (attempt {n})")
    if mode == "always":
        raise DependencyTimeout("dependency always times out")
    if mode == "broken" and (OUT / "broken").exists():
        raise DependencyTimeout("dependency broken until the operator fixes it")

    def apply() -> None:
        applied.add(event_id)
        record("applied", event_id=event_id, request_id=request_id, record_id=envelope.payload.avcc_record_id)

    return Effects(apply=apply)


@app.agent(source)
async def consume(stream):
    await runtime.consume(stream, handler, contract_topics={TOPIC: APPLY_CREATED.name}, parking=parking)


app.service(
    OwnConsumerService(lambda: RetryForwarder(settings, group_id=f"{APP_ID}-retry", target_groups={GROUP}))
)

if os.environ.get("FAULTS_CONSOLE") == "1":
    from app.ops.dlq.console import install_console

    install_console(app, settings)


if __name__ == "__main__":
    app.main()
'''


# -- broker helpers ------------------------------------------------------------------------------


def ensure_topics(bootstrap: str, topics: dict[str, int]) -> None:
    """Create ``{name: partitions}`` if missing and wait until the broker lists them with leaders."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=10).topics
    new = [
        NewTopic(n, num_partitions=p, replication_factor=1) for n, p in topics.items() if n not in existing
    ]
    if new:
        for name, future in admin.create_topics(new, operation_timeout=10).items():
            try:
                future.result()
            except Exception as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                    raise AssertionError(f"cannot create {name}: {exc}") from exc
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = admin.list_topics(timeout=5).topics
        if all(
            n in listed
            and len(listed[n].partitions) >= p
            and all(pm.leader >= 0 for pm in listed[n].partitions.values())
            for n, p in topics.items()
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"topics {sorted(topics)} not ready")


def plan_topics(bootstrap: str, *extra: tuple[str, int]) -> None:
    """The shared retry/DLQ topics of the plan, created as planned (retention too: other modules
    apply the plan on the same broker and must find no drift), plus the test's own topics."""
    apply_plan(Settings(kafka_url=f"kafka://{bootstrap}"), [RETRY, DLQ])
    ensure_topics(bootstrap, {RETRY.name: RETRY.partitions, DLQ.name: DLQ.partitions, **dict(extra)})


Headers = list[tuple[str, bytes]]


def produce(
    bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes, Headers, int | None]]
) -> list[tuple[int, int]]:
    """Produce in order (idempotent producer, acks=all) and wait for every ack; the
    ``(partition, offset)`` each message was stored at."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
        }
    )
    errors: list[str] = []
    stored: list[tuple[int, int]] = [(-1, -1)] * len(messages)

    def on_delivery(index: int, err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            stored[index] = (msg.partition(), msg.offset())

    for index, (key, value, headers, partition) in enumerate(messages):
        callback = functools.partial(on_delivery, index)
        kwargs: dict[str, Any] = {"headers": headers, "on_delivery": callback}
        if partition is not None:
            kwargs["partition"] = partition
        producer.produce(topic, value, key, **kwargs)
    assert producer.flush(30) == 0
    assert not errors, errors
    return stored


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    header_list: Headers
    timestamp_ms: int

    def header(self, name: str) -> str | None:
        raw = self.headers.get(name)
        return raw.decode() if raw is not None else None


def read_topic(
    bootstrap: str,
    topic: str,
    match: Callable[[Record], bool],
    *,
    expected: int,
    timeout_s: float = 30.0,
    settle_s: float = 0.0,
) -> list[Record]:
    """Matching records of ``topic`` from the beginning, once ``expected`` are there (or timeout),
    then ``settle_s`` more seconds to catch unexpected extras."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        found: list[Record] = []
        deadline = time.monotonic() + timeout_s
        settle_until: float | None = None
        while True:
            now = time.monotonic()
            if settle_until is None and len(found) >= expected:
                settle_until = now + settle_s
            if (settle_until is not None and now >= settle_until) or now > deadline:
                return found
            for msg in consumer.consume(500, 0.2):
                if msg.error() is not None:
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    continue
                rec = _record(msg)
                if match(rec):
                    found.append(rec)
    finally:
        consumer.close()


# -- events --------------------------------------------------------------------------------------


def apply_event(record_id: int, request_id: str) -> tuple[str, bytes, bytes]:
    """``(event_id, key, value)`` of a valid apply.created event."""
    payload = ApplyCreated(
        request_id=request_id,
        avcc_record_id=record_id,
        content_url=f"s3://bucket/works/{record_id}.mp4",
        content_hash="sha256:" + hashlib.sha256(str(record_id).encode()).hexdigest(),
        ai_tool_info=AiToolInfo(model_name="sdxl", model_version="1.0"),
        priority=5,
    )
    envelope = make_envelope(payload, source="code-svc")
    return str(envelope.event_id), record_key(record_id), encode_event(envelope)


def record_id_on(partition: int, start: int) -> int:
    """The first record id >= ``start`` whose key lands on ``partition``."""
    rid = start
    while partition_for(record_key(rid), PARTITIONS) != partition:
        rid += 1
    return rid


# -- the worker ----------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FaultsWorker:
    """One faust worker subprocess running the fault-injection app."""

    bootstrap: str
    out: Path
    unique: str
    console: bool = False
    env_extra: dict[str, str] = field(default_factory=dict)
    web_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def app_id(self) -> str:
        return f"faults-{self.unique}"

    @property
    def group(self) -> str:
        return f"g{self.unique}"

    @property
    def topic(self) -> str:
        return f"test.faults.{self.unique}"

    def start(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        script = self.out / "faults_worker.py"
        script.write_text(WORKER_SOURCE)
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "AVCC_KAFKA_URL": f"kafka://{self.bootstrap}",
            "AVCC_DATA_DIR": str(self.out / "data"),
            "AVCC_RETRY_BACKOFF_S": orjson.dumps(list(BACKOFF_S)).decode(),
            "AVCC_RETRY_TOPIC_DELAY_S": str(TOPIC_DELAY_S),
            "AVCC_RETRY_TOPIC_ROUNDS": "1",
            "AVCC_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "AVCC_DEV_MODE": "true",
            "AVCC_LOG_LEVEL": "INFO",
            "FAULTS_APP_ID": self.app_id,
            "FAULTS_TOPIC": self.topic,
            "FAULTS_GROUP": self.group,
            "FAULTS_OUT": str(self.out),
            "FAULTS_PARTITIONS": str(PARTITIONS),
            "FAULTS_CONSOLE": "1" if self.console else "0",
            **self.env_extra,
        }
        args = [sys.executable, str(script), "worker", "-l", "info"]
        if self.console:
            self.web_port = self.web_port or free_port()
            env["AVCC_WEB_PORT"] = str(self.web_port)
            env["AVCC_WEB_HOST"] = "127.0.0.1"
            args += ["--web-port", str(self.web_port), "--web-host", "127.0.0.1"]
        else:
            args += ["--without-web"]
        log = (self.out / "worker.log").open("wb")
        self.proc = subprocess.Popen(args, cwd=self.out, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        path = self.out / "worker.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        path = self.out / "events.jsonl"
        if not path.exists():
            return []
        rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        return [r for r in rows if kind is None or r["kind"] == kind]

    def applied_ids(self) -> list[str]:
        return [r["event_id"] for r in self.events("applied")]

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"worker exited ({self.proc.returncode}) waiting for {what}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}; events={self.events()}\n{self.log_tail()}"
                )
            time.sleep(0.1)


@pytest.fixture(scope="module")
def worker(module_kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultsWorker]:
    """The module's one fault-injection worker, on the module's own broker: each test produces
    events with fresh ids to its topic and reads what followed from its own starting offsets."""
    w = FaultsWorker(module_kafka.bootstrap, tmp_path_factory.mktemp("faults-worker"), uuid.uuid4().hex[:12])
    plan_topics(module_kafka.bootstrap, (w.topic, PARTITIONS))
    w.start()
    yield w
    w.stop()


def _record(msg: Any) -> Record:
    header_list = [(k, bytes(v or b"")) for k, v in (msg.headers() or [])]
    return Record(
        msg.topic(),
        msg.partition(),
        msg.offset(),
        msg.key(),
        msg.value() or b"",
        dict(header_list),
        header_list,
        msg.timestamp()[1],
    )


@dataclass(frozen=True)
class Since:
    """Where a test starts: the retry and DLQ topics' end offsets and the worker's event log."""

    dlq: dict[int, int]
    retry: dict[int, int]
    events: int

    @classmethod
    def now(cls, bootstrap: str, w: FaultsWorker) -> Since:
        return cls(end_offsets(bootstrap, DLQ.name), end_offsets(bootstrap, RETRY.name), len(w.events()))


def events_since(w: FaultsWorker, since: Since, kind: str) -> list[dict[str, Any]]:
    return [r for r in w.events()[since.events :] if r["kind"] == kind]


def wait_dead_letter(bootstrap: str, since: Since, event_id: str) -> None:
    """Wait until ``event_id`` has a dead letter (after ``since``)."""
    read_to_sentinel(
        bootstrap,
        DLQ.name,
        lambda m: header_value(m.headers(), "avcc-event-id") == event_id.encode(),
        start=since.dlq,
        timeout_s=DEADLINE_S,
    )


def header_value(headers: Any, name: str) -> bytes | None:
    return next((bytes(v or b"") for k, v in headers or [] if k == name), None)


def after_sentinels(bootstrap: str, w: FaultsWorker, since: Since) -> tuple[list[Record], list[Record]]:
    """Everything the worker sent to the DLQ and the retry topic for the test's topic since
    ``since``, read to a sentinel: one undecodable message per partition, produced now. The DLQ
    is read until their dead letters arrive (every partition processed past the test's events),
    the worker's commit past them is awaited (it commits only once a batch's outputs are
    acknowledged), then both topics are read to their end. Sentinels are left out."""
    token = uuid.uuid4().hex.encode()
    values = {b"sentinel-" + token + b"-%d" % p for p in range(PARTITIONS)}
    stored = produce(
        bootstrap,
        w.topic,
        [(b"sentinel-%d" % p, b"sentinel-" + token + b"-%d" % p, [], p) for p in range(PARTITIONS)],
    )
    read_to_sentinel(
        bootstrap,
        DLQ.name,
        lambda m: m.value() in values,
        sentinels=PARTITIONS,
        start=since.dlq,
        timeout_s=DEADLINE_S,
    )
    wait_committed(bootstrap, w.app_id, w.topic, {p: o + 1 for p, o in stored}, timeout_s=DEADLINE_S)

    def mine(topic: str, start: dict[int, int]) -> list[Record]:
        records = [_record(m) for m in read_range(bootstrap, topic, start=start)]
        return [r for r in records if r.header("avcc-original-topic") == w.topic and r.value not in values]

    return mine(DLQ.name, since.dlq), mine(RETRY.name, since.retry)


# -- tests ---------------------------------------------------------------------------------------


def test_transient_failures_are_retried_in_process_and_processed_once(
    module_kafka: Any, worker: FaultsWorker
) -> None:
    w, bootstrap = worker, module_kafka.bootstrap
    since = Since.now(bootstrap, w)
    flaky_id, key, value = apply_event(7001, "fail2-flaky")
    ok_id, ok_key, ok_value = apply_event(7002, "ok-plain")
    produce(bootstrap, w.topic, [(key, value, [("trace-id", b"t1")], None), (ok_key, ok_value, [], None)])
    w.wait_for(lambda: {flaky_id, ok_id} <= set(w.applied_ids()), DEADLINE_S, "both events applied")
    dead, retried = after_sentinels(bootstrap, w, since)
    assert dead == [] and retried == []  # in process only: neither the retry topic nor the DLQ
    assert w.applied_ids().count(flaky_id) == 1
    assert w.applied_ids().count(ok_id) == 1
    attempts = [r for r in w.events("attempt") if r["event_id"] == flaky_id]
    assert [r["n"] for r in attempts] == [1, 2, 3]
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(attempts)]
    # never before its backoff
    assert gaps[0] >= BACKOFF_S[0] - CLOCK_SLACK_S and gaps[1] >= BACKOFF_S[1] - CLOCK_SLACK_S, gaps


def test_permanent_failure_backs_off_goes_through_retry_topic_then_one_dlq_message(
    module_kafka: Any, worker: FaultsWorker
) -> None:
    w, bootstrap = worker, module_kafka.bootstrap
    since = Since.now(bootstrap, w)
    event_id, key, value = apply_event(7101, "always-down")
    [(partition, offset)] = produce(bootstrap, w.topic, [(key, value, [("trace-id", b"t-always")], None)])
    wait_dead_letter(bootstrap, since, event_id)
    [dead], [retried] = after_sentinels(bootstrap, w, since)
    # full metadata, original key/value/headers
    meta = FailureMetadata.from_headers(dead.header_list)
    assert dead.key == key and dead.value == value
    assert dead.header("trace-id") == "t-always"
    assert meta.original_topic == w.topic
    assert meta.original_partition == partition_for(key, PARTITIONS) == partition
    assert meta.original_offset == offset
    assert meta.consumer_group == w.group
    assert meta.event_id == event_id
    assert meta.error_class == "app.platform.errors.DependencyTimeout"
    assert meta.error_message == "dependency always times out"
    assert meta.stacktrace and "DependencyTimeout" in meta.stacktrace and "handler" in meta.stacktrace
    per_round = len(BACKOFF_S) + 1
    assert meta.attempt == 2 * per_round  # a full backoff round before and after the retry topic
    assert meta.first_failure_ms <= meta.last_failure_ms
    assert meta.not_before_ms is None
    assert "avcc-target-group" not in dead.headers and "avcc-retry-round" not in dead.headers

    # exactly one retry-topic round, meant for this group, delayed by the configured delay
    assert retried.header("avcc-target-group") == w.group
    assert retried.header("avcc-retry-round") == "1"
    assert retried.header("avcc-parked") == "0"
    assert retried.key == key and retried.value == value and retried.header("trace-id") == "t-always"
    retry_meta = FailureMetadata.from_headers(retried.header_list)
    assert retry_meta.not_before_ms is not None
    # the header's not-before is computed (two clock reads apart): the delay after the last failure
    delay_ms = retry_meta.not_before_ms - retry_meta.last_failure_ms
    assert TOPIC_DELAY_S * 950 <= delay_ms <= TOPIC_DELAY_S * 1050, delay_ms

    # the measured schedule: backoff, retry-topic delay, backoff again, never before its delay
    attempts = [r for r in w.events("attempt") if r["event_id"] == event_id]
    assert [r["n"] for r in attempts] == list(range(1, 2 * per_round + 1))
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(attempts)]
    backoffs = [*gaps[: len(BACKOFF_S)], *gaps[len(BACKOFF_S) + 1 :]]
    assert all(g >= e - CLOCK_SLACK_S for g, e in zip(backoffs, [*BACKOFF_S, *BACKOFF_S], strict=True)), gaps
    redelivered = gaps[len(BACKOFF_S)]
    assert redelivered >= TOPIC_DELAY_S - CLOCK_SLACK_S, gaps
    assert event_id not in w.applied_ids()


def test_poison_and_schema_invalid_messages_go_to_dlq_without_stalling_the_partition(
    module_kafka: Any, worker: FaultsWorker
) -> None:
    w, bootstrap = worker, module_kafka.bootstrap
    since = Since.now(bootstrap, w)
    valid = [apply_event(7200 + i, f"ok-{i}") for i in range(4)]
    bad_schema = orjson.loads(valid[0][2])
    bad_schema["event_id"] = str(uuid.uuid4())
    bad_schema["payload"]["priority"] = 99
    bad_schema["payload"]["avcc_record_id"] = 7299
    poison = [b"\xff\xfe\x00 not json", orjson.dumps(bad_schema), b"[1, 2, 3]"]
    messages: list[tuple[bytes | None, bytes, Headers, int | None]] = []
    for i, (_eid, key, value) in enumerate(valid):
        messages.append((key, value, [], 0))
        if i < len(poison):
            messages.append(
                (b"poison-%d" % i if i != 1 else record_key(7299), poison[i], [("n", b"%d" % i)], 0)
            )
    produce(bootstrap, w.topic, messages)
    valid_ids = [eid for eid, _k, _v in valid]
    w.wait_for(lambda: set(valid_ids) <= set(w.applied_ids()), DEADLINE_S, "all valid events applied")
    dead, retried = after_sentinels(bootstrap, w, since)
    # in partition order, none lost, none twice, nothing else
    assert [r["event_id"] for r in events_since(w, since, "applied")] == valid_ids
    assert len(dead) == 3
    by_value = {d.value: d for d in dead}
    assert set(by_value) == set(poison)
    for raw, expected_class in zip(
        poison,
        [
            "schemas.errors.UndecodableMessage",
            "schemas.errors.SchemaViolation",
            "schemas.errors.UndecodableMessage",
        ],
        strict=True,
    ):
        meta = FailureMetadata.from_headers(by_value[raw].header_list)
        assert meta.error_class == expected_class
        assert meta.attempt == 1  # no retries for bad input
        assert meta.original_partition == 0
        assert by_value[raw].header("n") is not None
    schema_meta = FailureMetadata.from_headers(by_value[poison[1]].header_list)
    assert "payload.priority" in schema_meta.error_message
    assert retried == []
    # every bad message was tried exactly once (no handler attempts at all: decoding failed)
    assert {r["event_id"] for r in events_since(w, since, "attempt")} == set(valid_ids)


def test_later_events_of_a_key_wait_behind_one_in_the_retry_path(
    module_kafka: Any, worker: FaultsWorker
) -> None:
    w, bootstrap = worker, module_kafka.bootstrap
    since = Since.now(bootstrap, w)
    k = record_id_on(1, 7300)
    first, key, v1 = apply_event(k, "fail4-first")  # exhausts in-process retries: retry topic
    second, _, v2 = apply_event(k, "ok-second")
    third, _, v3 = apply_event(k, "ok-third")
    others = [apply_event(record_id_on(p, 7400 + 10 * p), f"ok-other{p}") for p in (0, 1, 2)]
    msgs: list[tuple[bytes | None, bytes, Headers, int | None]] = [
        (key, v1, [], None),
        (key, v2, [], None),
        (key, v3, [], None),
    ]
    msgs += [(ok, ov, [], None) for _e, ok, ov in others]
    produce(bootstrap, w.topic, msgs)
    w.wait_for(lambda: {first, second, third} <= set(w.applied_ids()), DEADLINE_S, "key K applied")
    applied = w.events("applied")
    order = [r["event_id"] for r in applied]
    assert [e for e in order if e in {first, second, third}] == [first, second, third]
    t_first = next(r["t"] for r in applied if r["event_id"] == first)
    w.wait_for(lambda: {e for e, _k, _v in others} <= set(w.applied_ids()), DEADLINE_S, "other keys applied")
    applied = w.events("applied")
    for other_id, _k, _v in others:
        t_other = next(r["t"] for r in applied if r["event_id"] == other_id)
        assert t_other < t_first, "another key waited for K's retry"
    dead, retried = after_sentinels(bootstrap, w, since)
    # K's later events travelled the retry path as parked messages, right behind the failed one
    assert len(retried) == 3
    by_event = {r.header("avcc-event-id") or "": r for r in retried}
    assert by_event[first].header("avcc-parked") == "0"
    parked = [r for r in retried if r.header("avcc-parked") == "1"]
    assert len(parked) == 2 and {p.value for p in parked} == {v2, v3}
    assert len({r.partition for r in retried}) == 1
    assert [r.value for r in sorted(retried, key=lambda r: r.offset)] == [v1, v2, v3]
    # K's first event needed 5 attempts (4 failures), the others one each, nothing dead-lettered
    assert [r["n"] for r in w.events("attempt") if r["event_id"] == first] == [1, 2, 3, 4, 5]
    assert [r["n"] for r in w.events("attempt") if r["event_id"] == second] == [1]
    assert dead == []
