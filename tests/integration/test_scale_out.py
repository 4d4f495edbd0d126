"""Scale-out on a 3-node Apache Kafka KRaft cluster (RF 3, min.insync.replicas 2): two replicas
of each core group, each on its own loopback address and the group's one port (like pods).

The failover test applies 200 times at 10/s through both code replicas (a client that retries
503 and refused connections on the next replica, boundedly, like a Service), SIGKILLs the leader
of ``apply.created[0]`` 8 s in and restarts it 20 s later, and SIGKILLs one code and one review
replica meanwhile; then everything is counted. The routing test asks every replica the same
record, decision and settlement questions and compares the answers.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from app.api import APPLY
from app.lifecycle.chain.ledger import verify_ledger
from app.platform.faust.app import consumer_group_id
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.lag.reader import OffsetReader
from app.platform.settings import Settings
from app.platform.topics import (
    APPLY_CREATED,
    CHAIN_TX_CONFIRMED,
    CHAIN_TX_PENDING,
    CODE_REVIEW_FINISHED,
    REVIEW_TASK_FINISHED,
    TOPIC_PLAN,
)
from testing.kafka_cluster import KafkaCluster
from testing.ledger_node import LedgerNode
from tests.integration.stack import CORE_GROUPS, Stack, application, issued_exactly_once, record_when
from tests.integration.test_lifecycle import _read_all
from tests.unit.lifecycle.applications import SETTLEMENT_INSTRUCTION

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1500)]

REPLICAS = 2
APPLICATIONS = 200
RATE_PER_S = 10.0
LEADER_KILL_AT_S = 8.0
LEADER_DOWN_S = 20.0
CODE_KILL_AT_S = 12.0
REVIEW_KILL_AT_S = 16.0
#: Bounds of one request's retries (503 or a refused connection: the next replica is tried).
MAX_ATTEMPTS = 60
REQUEST_BUDGET_S = 120.0
#: How long the restarted node may take to be back in every ISR of apply.created.
IN_SYNC_WAIT_S = 90.0
ACCEPTED = frozenset({202})


@pytest.fixture(scope="module")
def ledger_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerNode]:
    """The one ledger every chain replica notarises on (as they would on an EVM node)."""
    node = LedgerNode(tmp_path_factory.mktemp("ledger-node"), token=f"scale-{uuid.uuid4().hex}")
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def cluster_stack(
    module_kafka_cluster: KafkaCluster, ledger_node: LedgerNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Two replicas of code, review, chain and settlement, and a retry worker, on the cluster;
    the chain replicas share one ledger node."""
    cluster = module_kafka_cluster
    rf = cluster.replication_factor
    settings = Settings(kafka_url=f"kafka://{cluster.bootstrap}", replication_factor=rf)
    apply_plan(settings, [*TOPIC_PLAN, *changelog_specs()])
    env = {"AVCC_REPLICATION_FACTOR": str(rf), **ledger_node.env}
    stack = Stack(cluster.bootstrap, tmp_path_factory.mktemp("scale-out"), env=env)
    try:
        stack.start(*CORE_GROUPS, "retry")
        stack.start(*CORE_GROUPS, index=1)
        stack.supervise()
        yield stack
    finally:
        stack.stop_all()


@dataclass
class Traffic:
    """Every request's outcome: attempts, latency from first send to its 2xx, failures."""

    attempts: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: Why attempts were sent again: the 503's reason, or the connection error.
    refusals: Counter[str] = field(default_factory=Counter)

    @property
    def retried(self) -> int:
        """Requests that needed more than one attempt."""
        return sum(1 for a in self.attempts if a > 1)

    def summary(self) -> str:
        """One line for the report."""
        worst = max(self.latencies, default=0.0)
        extra = sum(self.attempts) - len(self.attempts)
        return (
            f"requests={len(self.attempts)} retried={self.retried} extra_attempts={extra} "
            f"max_latency_s={worst:.2f} failures={len(self.failures)} refusals={dict(self.refusals)}"
        )


async def call_any_replica(
    stack: Stack,
    traffic: Traffic,
    group: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    first: int = 0,
    ok: frozenset[int] = frozenset({200, 202}),
) -> Any:
    """One logical request: sent to replica ``first`` and, after a 503 (waiting its
    ``retry_after_s``) or a refused/reset connection, to the next replica, within the bounds.
    Any other answer, or running out of attempts, is a failure (recorded, and ``None``)."""
    replicas = stack.replicas(group)
    started = time.monotonic()
    last: Any = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        index = replicas[(first + attempt - 1) % len(replicas)]
        delay = 0.5
        try:
            status, answer = await asyncio.wait_for(stack.call(group, method, path, body, index=index), 30)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            last = f"{type(exc).__name__}: {exc}"
            traffic.refusals[type(exc).__name__] += 1
        else:
            if status in ok:
                traffic.attempts.append(attempt)
                traffic.latencies.append(time.monotonic() - started)
                return answer
            last = (status, answer)
            if status != 503:
                break
            delay = float(answer.get("retry_after_s", 1)) if isinstance(answer, dict) else 1.0
            reason = answer.get("reason") or answer.get("error") if isinstance(answer, dict) else None
            traffic.refusals[f"503 {reason}"] += 1
        if time.monotonic() - started > REQUEST_BUDGET_S:
            break
        await asyncio.sleep(delay)
    traffic.attempts.append(attempt)
    traffic.failures.append(f"{method} {path}: {last}")
    return None


@dataclass
class Failover:
    """What the chaos schedule did and how long the cluster took to recover."""

    leader: int = -1
    new_leader_after_s: float | None = None
    node_ready_after_s: float | None = None
    in_sync_after_s: float | None = None
    events: list[str] = field(default_factory=list)


async def chaos(stack: Stack, cluster: KafkaCluster, start: float, report: Failover) -> None:
    """Kill the leader of apply.created[0] at 8 s and restart it 20 s later; kill one code and
    one review replica in between (the stack's supervisor restarts them, as Kubernetes would)."""

    async def at(offset_s: float) -> None:
        await asyncio.sleep(max(0.0, start + offset_s - time.monotonic()))

    await at(LEADER_KILL_AT_S)
    report.leader = await asyncio.to_thread(cluster.leader_of, APPLY_CREATED.name, 0)
    node = cluster.node(report.leader)
    node.kill()
    killed_at = time.monotonic()
    report.events.append(f"{killed_at - start:.1f}s: SIGKILL kafka node {report.leader}")
    while time.monotonic() - killed_at < LEADER_DOWN_S:
        try:
            leader = await asyncio.to_thread(cluster.leader_of, APPLY_CREATED.name, 0, 3.0)
        except Exception:
            leader = -1
        if leader not in (-1, report.leader):
            report.new_leader_after_s = time.monotonic() - killed_at
            report.events.append(f"new leader: node {leader} after {report.new_leader_after_s:.1f}s")
            break
        await asyncio.sleep(0.2)
    await at(CODE_KILL_AT_S)
    stack.kill("code", 1)
    report.events.append(f"{time.monotonic() - start:.1f}s: SIGKILL code-1")
    await at(REVIEW_KILL_AT_S)
    stack.kill("review", 1)
    report.events.append(f"{time.monotonic() - start:.1f}s: SIGKILL review-1")
    await at(LEADER_KILL_AT_S + LEADER_DOWN_S)
    restarted = time.monotonic()
    node.start(wait=False)  # from the test's thread: the node dies with the thread that starts it
    await asyncio.to_thread(node.wait_ready)
    report.node_ready_after_s = time.monotonic() - restarted
    report.events.append(f"node {report.leader} ready {report.node_ready_after_s:.1f}s after its restart")
    while time.monotonic() - restarted < IN_SYNC_WAIT_S:
        if await asyncio.to_thread(cluster.fully_in_sync, APPLY_CREATED.name):
            report.in_sync_after_s = time.monotonic() - restarted
            report.events.append(f"apply.created in sync {report.in_sync_after_s:.1f}s after the restart")
            break
        await asyncio.sleep(0.5)


DECISION_LINE = re.compile(r'avcc_consumer_offset_decisions_total\{.*decision="([a-z_]+)".*\} (\S+)')


async def offset_decisions(stack: Stack) -> dict[str, float]:
    """``avcc_consumer_offset_decisions_total`` of every core replica by decision (since each
    one's last start): how often the batch agents dropped a redelivery or fetched again."""
    totals: dict[str, float] = {}
    for group in CORE_GROUPS:
        for index in stack.replicas(group):
            _, text = await stack.call(group, "GET", "/metrics", signed=False, index=index)
            for line in str(text).splitlines():
                found = re.match(
                    r'avcc_consumer_offset_decisions_total\{.*decision="([a-z_]+)".*\} (\S+)', line
                )
                if found:
                    totals[found.group(1)] = totals.get(found.group(1), 0.0) + float(found.group(2))
    return totals


#: The input topics of each core group whose committed offsets explain a record that stopped.
GROUP_INPUTS = {
    "review": (APPLY_CREATED,),
    "code": (APPLY_CREATED, REVIEW_TASK_FINISHED, CODE_REVIEW_FINISHED, CHAIN_TX_CONFIRMED),
    "chain": (REVIEW_TASK_FINISHED,),
}


def uncommitted(cluster: KafkaCluster) -> list[str]:
    """Every partition of the groups' inputs with committed offset below its end: where a stuck
    record's event was lost (committed past it) or is still unread (committed below it)."""
    reader = OffsetReader(Settings(kafka_url=f"kafka://{cluster.bootstrap}"))
    try:
        found = []
        for group, specs in GROUP_INPUTS.items():
            tps = [(spec.name, p) for spec in specs for p in range(spec.partitions)]
            for offsets in reader.group_offsets(consumer_group_id(group), tps):
                if offsets.lag:
                    found.append(
                        f"{group} {offsets.topic}[{offsets.partition}] {offsets.committed}/{offsets.end}"
                    )
        return found
    finally:
        reader.close()


def event_trail(cluster: KafkaCluster, failure: str) -> list[str]:
    """Where the events of the record a failure names sit (topic[partition]@offset): the hop
    that lost it is the first topic without one."""
    found = re.search(r"record (\d+)", failure)
    if found is None:
        return []
    key = found.group(1).encode()
    topics = [APPLY_CREATED, REVIEW_TASK_FINISHED, CODE_REVIEW_FINISHED, CHAIN_TX_PENDING, CHAIN_TX_CONFIRMED]
    messages = _read_all(cluster.bootstrap, [spec.name for spec in topics])
    return [f"{m.topic()}[{m.partition()}]@{m.offset()}" for m in messages if m.key() == key]


def ledger_transactions(node: LedgerNode) -> int:
    """Transactions on the chain replicas' one ledger, verified intact (one per idempotency key)."""
    check = verify_ledger(node.ledger_path)
    assert check.ok, check.error
    return check.transactions


async def test_failover_under_load_loses_duplicates_and_refuses_nothing(
    cluster_stack: Stack, module_kafka_cluster: KafkaCluster, ledger_node: LedgerNode
) -> None:
    stack = cluster_stack
    txs_before = ledger_transactions(ledger_node)
    traffic, failover = Traffic(), Failover()
    start = time.monotonic()

    async def apply_at(n: int) -> int | None:
        await asyncio.sleep(max(0.0, start + n / RATE_PER_S - time.monotonic()))
        body = application(request_id=f"req_scale_{uuid.uuid4().hex[:10]}")
        answer = await call_any_replica(stack, traffic, "code", "POST", APPLY.path, body, first=n)
        return None if answer is None else int(answer["avcc_record_id"])

    chaos_task = asyncio.create_task(chaos(stack, module_kafka_cluster, start, failover))
    record_ids = await asyncio.gather(*(apply_at(n) for n in range(APPLICATIONS)))
    await chaos_task
    applied_after_s = time.monotonic() - start
    assert not traffic.failures, f"{traffic.summary()}\n" + "\n".join(traffic.failures[:20])
    issued_ids = [r for r in record_ids if r is not None]
    assert len(set(issued_ids)) == APPLICATIONS

    try:
        await issued_exactly_once(stack, issued_ids)
    except (AssertionError, aiohttp.ClientError) as exc:
        lag = await asyncio.to_thread(uncommitted, module_kafka_cluster)
        trail = await asyncio.to_thread(event_trail, module_kafka_cluster, str(exc))
        raise AssertionError(
            f"not every record issued once ({exc}); worker exits: {stack.exits}; uncommitted: {lag}; "
            f"events of the stuck record: {trail}"
        ) from exc
    all_issued_after_s = time.monotonic() - start
    transactions = ledger_transactions(ledger_node) - txs_before
    assert transactions == APPLICATIONS, "a failover lost or doubled a transaction"
    exits = sorted((group, index) for group, index, _ in stack.exits)
    assert exits == sorted(stack.killed), f"unexpected worker exits {stack.exits}\n{stack.logs()}"
    decisions = await offset_decisions(stack)
    print(
        f"\nscale-out failover: {traffic.summary()}; offset decisions={decisions}; leader={failover.leader} "
        f"new_leader_after_s={failover.new_leader_after_s} node_ready_after_s={failover.node_ready_after_s} "
        f"in_sync_after_s={failover.in_sync_after_s} "
        f"applied_after_s={applied_after_s:.1f} all_issued_after_s={all_issued_after_s:.1f}\n  "
        + "\n  ".join(failover.events)
    )


def _same_from_every_replica(answers: dict[int, tuple[int, Any]], what: str) -> tuple[int, Any]:
    assert len({repr(a) for a in answers.values()}) == 1, f"{what}: replicas disagree: {answers}"
    return next(iter(answers.values()))


async def ask_every_replica(
    stack: Stack, group: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """The same question to each replica of ``group`` (each signed afresh); the one answer."""
    answers = {i: await stack.call(group, method, path, body, index=i) for i in stack.replicas(group)}
    return _same_from_every_replica(answers, f"{method} {path}")


def instruction(avcc_code: str, record_id: int) -> dict[str, Any]:
    """A settlement instruction body for an issued record."""
    unique = uuid.uuid4().hex[:12]
    settlement = {**SETTLEMENT_INSTRUCTION, "instruction_id": f"ins-{unique}", "avcc_code": avcc_code}
    return {"avcc_record_id": record_id, "request_id": f"req_ins_{unique}", "settlement": settlement}


async def test_every_replica_answers_record_decision_and_settlement_reads_alike(cluster_stack: Stack) -> None:
    stack = cluster_stack
    await asyncio.to_thread(stack.wait_all_ready)
    traffic = Traffic()
    unknown_model = {"model_name": "home-made-diffuser", "model_version": "v2.1.0"}
    bodies = [application() for _ in range(6)] + [application(ai_tool_info=unknown_model) for _ in range(6)]
    answers = [
        await call_any_replica(stack, traffic, "code", "POST", APPLY.path, b, first=n)
        for n, b in enumerate(bodies)
    ]
    assert not traffic.failures, traffic.failures
    ids = [int(a["avcc_record_id"]) for a in answers]
    issued = await issued_exactly_once(stack, ids[:6])
    for record_id in ids[6:]:
        await record_when(stack, record_id, lambda r: r["status"] == "need_human")
    # The review workbench's listing: the same from either replica, each holding half the tasks.
    status, listing = await ask_every_replica(stack, "review", "GET", "/v1/review/tasks?status=need_human")
    assert status == 200, listing
    listed = [t["avcc_record_id"] for t in listing["tasks"]]
    assert set(ids[6:]) <= set(listed) and len(listed) == len(set(listed)) == listing["count"], listing

    approve = {"decision": "approve", "final_level": "G", "reviewer": "rev-1", "reason": "checked provenance"}
    for n, rid in enumerate(ids[6:]):  # each decision through either replica reaches the owner
        path = f"/v1/review/tasks/{rid}/decision"
        done = await call_any_replica(stack, traffic, "review", "POST", path, approve, ok=ACCEPTED, first=n)
        assert done, traffic.failures
    assert not traffic.failures, traffic.failures
    for record_id in ids[6:]:
        await record_when(stack, record_id, lambda r: r.get("avcc_code"))

    for record_id in ids:
        status, record = await ask_every_replica(stack, "code", "GET", f"/v1/avcc/records/{record_id}")
        assert status == 200 and record["status"] == "issued", record
        status, refusal = await ask_every_replica(
            stack, "review", "POST", f"/v1/review/tasks/{record_id}/decision", approve
        )
        assert status == 409, refusal
    missing = max(ids) + 10_000_000
    assert (await ask_every_replica(stack, "code", "GET", f"/v1/avcc/records/{missing}"))[0] == 404
    decide_missing = f"/v1/review/tasks/{missing}/decision"
    assert (await ask_every_replica(stack, "review", "POST", decide_missing, approve))[0] == 404

    instructions = [instruction(r["avcc_code"], int(r["avcc_record_id"])) for r in issued]
    for n, body in enumerate(instructions):
        path = "/v1/settlement/instructions"
        assert await call_any_replica(stack, traffic, "settlement", "POST", path, body, first=n)
    for body in instructions:
        path = f"/v1/settlement/instructions/{body['settlement']['instruction_id']}"
        deadline = time.monotonic() + 90
        while (await stack.call("settlement", "GET", path))[0] != 200:
            assert time.monotonic() < deadline, f"{path} never cleared\n{stack.logs(['settlement', 'chain'])}"
            await asyncio.sleep(0.5)
        status, clearing = await ask_every_replica(stack, "settlement", "GET", path)
        assert status == 200 and clearing["status"] == "cleared", clearing
    unknown = "/v1/settlement/instructions/ins-unknown-1"
    assert (await ask_every_replica(stack, "settlement", "GET", unknown))[0] == 404
