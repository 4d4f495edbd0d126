"""The ledger node (``avcc chain node``) as its chain replicas use it: one chain for all of them.

A real node process on loopback; two ``RemoteLedger`` clients stand for two chain replicas.
"""

from __future__ import annotations

import asyncio
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from app.lifecycle.chain.blocks import PendingTx
from app.lifecycle.chain.ledger import verify_ledger
from app.lifecycle.chain.node import TRANSACTIONS_PATH
from app.lifecycle.chain.remote import RemoteLedger
from app.platform.errors import ConfigurationError, DependencyUnavailable, SchemaViolation
from testing.ledger_node import LedgerNode
from testing.ports import free_port

pytestmark = pytest.mark.integration

TOKEN = f"node-test-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerNode]:
    server = LedgerNode(tmp_path_factory.mktemp("ledger-node"), token=TOKEN, block_interval_ms=50)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def replicas(node: LedgerNode) -> AsyncIterator[tuple[RemoteLedger, RemoteLedger]]:
    first, second = RemoteLedger(node.url, TOKEN), RemoteLedger(node.url, TOKEN)
    try:
        yield first, second
    finally:
        await first.aclose()
        await second.aclose()


def evidence(key: str, record_id: int = 7) -> PendingTx:
    return PendingTx(key, "copyright_main", record_id, {"content_hash": "ab" * 32, "level": "O"})


def transactions(node: LedgerNode) -> int:
    check = verify_ledger(node.ledger_path)
    assert check.ok, check.error
    return check.transactions


async def test_a_key_submitted_by_two_replicas_is_notarised_once(
    node: LedgerNode, replicas: tuple[RemoteLedger, RemoteLedger]
) -> None:
    first, second = replicas
    before = transactions(node)
    keys = [f"evidence:{uuid.uuid4().hex}" for _ in range(40)]
    # every key from both replicas at once, and once more afterwards (a new partition owner)
    receipts = await asyncio.gather(*(r.submit(evidence(k, n)) for n, k in enumerate(keys) for r in replicas))
    again = await asyncio.gather(*(second.submit(evidence(k, n)) for n, k in enumerate(keys)))
    assert transactions(node) - before == len(keys)
    by_key = {r.idempotency_key: r for r in receipts}
    assert len(by_key) == len(keys)
    assert all(r == by_key[r.idempotency_key] for r in [*receipts, *again])
    assert first.receipt(keys[0]) == by_key[keys[0]]
    assert first.receipt(f"evidence:{uuid.uuid4().hex}") is None


async def test_receipts_survive_a_sigkilled_node(
    node: LedgerNode, replicas: tuple[RemoteLedger, RemoteLedger]
) -> None:
    first, _ = replicas
    key = f"evidence:{uuid.uuid4().hex}"
    receipt = await first.submit(evidence(key))
    node.kill()
    with pytest.raises(DependencyUnavailable):
        await first.submit(evidence(f"evidence:{uuid.uuid4().hex}"))
    node.start()
    before = transactions(node)
    assert await first.submit(evidence(key)) == receipt
    assert transactions(node) == before


async def test_a_wrong_token_is_refused(node: LedgerNode) -> None:
    before = transactions(node)
    intruder = RemoteLedger(node.url, "not-the-token")
    try:
        with pytest.raises(ConfigurationError):
            await intruder.submit(evidence(f"evidence:{uuid.uuid4().hex}"))
    finally:
        await intruder.aclose()
    assert transactions(node) == before


def refused_status(url: str, body: bytes, headers: dict[str, str]) -> int:
    """The status of a POST the node must refuse."""
    request = urllib.request.Request(url, body, headers, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    return refused.value.code


def test_bad_documents_and_unsigned_posts_are_refused(node: LedgerNode) -> None:
    before = transactions(node)
    head = b'{"idempotency_key": "k", "chain_type": "copyright_main", "avcc_record_id": 7'
    bodies = [
        b"{not json",
        head.replace(b"7", b'"7"') + b', "body": {}}',
        head.replace(b'"k"', b'""') + b', "body": {}}',
        head.replace(b"copyright_main", b"moon") + b', "body": {}}',
        head + b"}",
        head + b', "body": {}, "x": 1}',
        head + b', "body": {"a": "' + b"x" * 300_000 + b'"}}',
    ]
    url, signed = node.url + TRANSACTIONS_PATH, {"Authorization": f"Bearer {TOKEN}"}
    assert [refused_status(url, body, signed) for body in bodies] == [400, 400, 400, 400, 400, 400, 413]
    assert refused_status(url, head + b', "body": {}}', {}) == 401
    assert transactions(node) == before
    with urllib.request.urlopen(node.url + "/metrics", timeout=5) as scrape:
        metrics = scrape.read().decode()
    counted = {
        status: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(f'avcc_http_requests_total{{method="POST",route="{TRANSACTIONS_PATH}"')
        for status in re.findall(r'status="(\d+)"', line)
    }
    assert counted["400"] >= 6 and counted["413"] >= 1 and counted["401"] >= 1, counted


async def test_an_unreachable_node_is_a_retriable_failure() -> None:
    nowhere = RemoteLedger(f"http://127.0.0.1:{free_port()}", TOKEN, timeout_s=2.0)
    try:
        with pytest.raises(DependencyUnavailable):
            await nowhere.submit(evidence(f"evidence:{uuid.uuid4().hex}"))
        with pytest.raises(DependencyUnavailable):
            nowhere.receipt("evidence:1")
    finally:
        await nowhere.aclose()


async def test_a_refused_document_is_a_schema_violation(replicas: tuple[RemoteLedger, RemoteLedger]) -> None:
    first, _ = replicas
    with pytest.raises(SchemaViolation):
        await first.submit(PendingTx("k" * 300, "copyright_main", 7, {}))
