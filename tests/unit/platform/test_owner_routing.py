"""Owner routing with replicas: a request that meets unsettled ownership (a rebalance, a table
partition still being recovered, an owner that moved or cannot be reached) is answered 503 with
``Retry-After`` after a bounded wait, never a wrong 404 and never forwarded twice; a request the
table answers as a whole is put to the peers under an explicit policy (first, all, merge), and
every call to a peer is signed as a peer call."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request

from app.platform.http import routing
from app.platform.http.peers import PEER_HEADER, is_peer_call
from app.platform.http.routing import (
    FanOutPolicy,
    OwnerRouting,
    RecordRequest,
    partitions_settled,
    wait_settled,
)
from app.platform.kafka.partitioner import partition_for, record_key
from app.platform.settings import Settings
from testing.ports import free_port

SELF = "http://127.0.0.2:7000"
PEER = "http://127.0.0.3:7000"


def table(partitions: int = 6) -> Any:
    return SimpleNamespace(
        name="records", partitions=partitions, changelog_topic=SimpleNamespace(get_topic_name=lambda: "cl")
    )


def worker(owned: dict[str, set[int]], *, rebalancing: bool = False, actives_ready: bool = True) -> Any:
    metadata = {url: {"cl": parts} for url, parts in owned.items()}
    return SimpleNamespace(
        rebalancing=rebalancing,
        tables=SimpleNamespace(actives_ready=actives_ready),
        conf=SimpleNamespace(canonical_url=SELF),
        router=SimpleNamespace(table_metadata=lambda name: metadata),
    )


@pytest.fixture
def short_wait() -> Iterator[None]:
    saved = routing.SETTLE_WAIT_S
    routing.SETTLE_WAIT_S = 0.2
    yield
    routing.SETTLE_WAIT_S = saved


def routing_of(app: Any) -> OwnerRouting:
    return OwnerRouting(app, table(), Settings())


def request_about(record_id: int, *, forwarded: bool) -> RecordRequest:
    signed: Any = SimpleNamespace(body=b"")
    return RecordRequest(signed, record_id, record_key(record_id), forwarded)


def test_partitions_are_settled_only_between_rebalances_once_recovered() -> None:
    assert partitions_settled(worker({SELF: {0}}))
    assert not partitions_settled(worker({SELF: {0}}, rebalancing=True))
    assert not partitions_settled(worker({SELF: {0}}, actives_ready=False))


async def test_a_request_waits_for_a_recovery_that_ends_within_the_bound() -> None:
    app = worker({SELF: {0}}, actives_ready=False)

    async def recover() -> None:
        await asyncio.sleep(0.15)
        app.tables.actives_ready = True

    task = asyncio.create_task(recover())
    assert await wait_settled(app, 2.0)
    await task
    assert not await wait_settled(worker({SELF: {0}}, rebalancing=True), 0.1)


async def test_a_record_request_during_a_recovery_is_a_503_with_retry_after(short_wait: None) -> None:
    app = worker({SELF: set(range(6))}, actives_ready=False)
    request = make_mocked_request("GET", "/v1/avcc/records/7")
    answer = await routing_of(app).answer_at_owner(request_about(7, forwarded=False), request)
    assert answer is not None and answer.status == 503
    assert answer.headers["Retry-After"] == "1"


async def test_a_forwarded_request_that_meets_a_moved_owner_is_refused_not_forwarded_again() -> None:
    moved = partition_for(record_key(7), 6)
    app = worker({SELF: set(range(6)) - {moved}, PEER: {moved}})
    request = make_mocked_request("GET", "/v1/avcc/records/7")
    answer = await routing_of(app).answer_at_owner(request_about(7, forwarded=True), request)
    assert answer is not None and answer.status == 503
    assert answer.headers["Retry-After"] == "1"


async def test_an_unassigned_partition_is_a_503() -> None:
    app = worker({SELF: set()})
    request = make_mocked_request("GET", "/v1/avcc/records/7")
    answer = await routing_of(app).answer_at_owner(request_about(7, forwarded=False), request)
    assert answer is not None and answer.status == 503


async def test_an_unreachable_owner_is_a_503_with_retry_after() -> None:
    request = make_mocked_request("GET", "/v1/avcc/records/7")
    owners = routing_of(worker({SELF: set()}))
    answer = await owners.forward(f"http://127.0.0.1:{free_port()}", request, b"")
    await owners.calls.close()
    assert answer.status == 503
    assert answer.headers["Retry-After"] == "1"


async def test_the_owners_retry_after_is_relayed() -> None:
    forwarded: list[bool] = []

    async def busy(request: web.Request) -> web.Response:
        forwarded.append(is_peer_call(request, await request.read(), Settings()))
        return web.json_response({"error": "rebalancing"}, status=503, headers={"Retry-After": "3"})

    owner = web.Application()
    owner.router.add_get("/v1/avcc/records/7", busy)
    owners = routing_of(worker({SELF: set()}))
    async with TestServer(owner, host="127.0.0.1") as server:
        request = make_mocked_request("GET", "/v1/avcc/records/7")
        answer = await owners.forward(str(server.make_url("")), request, b"")
    await owners.calls.close()
    assert answer.status == 503
    assert answer.headers["Retry-After"] == "3"
    assert forwarded == [True], "the owner knows a forwarded request by its peer signature"


def test_a_request_signed_by_no_peer_is_no_peer_call() -> None:
    unsigned = make_mocked_request("GET", "/v1/avcc/records/7", headers={PEER_HEADER: "0" * 64})
    assert not is_peer_call(unsigned, b"", Settings())


def test_peers_are_the_other_holders_and_the_table_is_incomplete_while_a_partition_has_no_owner() -> None:
    owners = routing_of(worker({SELF: {0, 1, 2}, PEER: {3, 4, 5}}))
    assert owners.peers() == {PEER: (3, 4, 5)} and owners.complete()
    assert owners.owner(4) == PEER and owners.owner(1) == SELF
    assert not routing_of(worker({SELF: {0, 1, 2}, PEER: {3, 4}})).complete()


async def _ask_listing_peers(*answers: tuple[int, bytes], policy: FanOutPolicy = "all") -> Any:
    """The fan-out under ``policy`` of a worker holding partitions 0-1 whose two peers (real
    servers, holding 2-3 and 4-5) answer ``GET /v1/review/tasks`` with these (status, body)."""
    servers = []
    for status, body in answers:

        async def listing(_: web.Request, status: int = status, body: bytes = body) -> web.Response:
            return web.Response(body=body, status=status, content_type="application/json")

        peer = web.Application()
        peer.router.add_get("/v1/review/tasks", listing)
        servers.append(TestServer(peer, host="127.0.0.1"))
    try:
        for server in servers:
            await server.start_server()
        first, second = (str(s.make_url("")).rstrip("/") for s in servers)
        owners = routing_of(worker({SELF: {0, 1}, first: {2, 3}, second: {4, 5}}))
        request = make_mocked_request("GET", "/v1/review/tasks")
        fanned = await owners.fan_out(request, policy)
        await owners.calls.close()
        return fanned
    finally:
        for server in servers:
            await server.close()


async def test_a_listing_gathers_the_answer_of_every_peer() -> None:
    fanned = await _ask_listing_peers((200, b'{"tasks": [1]}'), (200, b'{"tasks": [2]}'))
    assert fanned.refusal is None
    assert sorted(peer.body for peer in fanned.answers) == [b'{"tasks": [1]}', b'{"tasks": [2]}']
    assert sorted(peer.partitions for peer in fanned.answers) == [(2, 3), (4, 5)]


@pytest.mark.parametrize("status", [404, 500, 503])
async def test_a_listing_with_a_peer_unheard_is_a_503(status: int) -> None:
    fanned = await _ask_listing_peers((200, b'{"tasks": []}'), (status, b'{"error": "x"}'))
    assert fanned.refusal is not None and fanned.refusal.status == 503
    assert fanned.refusal.headers["Retry-After"] == "1"


async def test_a_listing_while_a_partition_has_no_owner_is_a_503() -> None:
    request = make_mocked_request("GET", "/v1/review/tasks")
    for policy in ("all", "first"):
        fanned = await routing_of(worker({SELF: {0, 1, 2}})).fan_out(request, policy)  # type: ignore[arg-type]
        assert fanned.refusal is not None and fanned.refusal.status == 503


async def test_first_is_the_first_peer_that_has_it_and_none_when_every_peer_answers_404() -> None:
    fanned = await _ask_listing_peers((404, b'{"error": "x"}'), (200, b'{"tasks": [2]}'), policy="first")
    assert fanned.refusal is None and [peer.body for peer in fanned.answers] == [b'{"tasks": [2]}']
    nowhere = await _ask_listing_peers((404, b"{}"), (404, b"{}"), policy="first")
    assert nowhere.refusal is None and nowhere.answers == []


async def test_first_with_a_peer_unheard_is_its_answer_never_a_404() -> None:
    fanned = await _ask_listing_peers((404, b"{}"), (503, b'{"error": "x"}'), policy="first")
    assert fanned.answers == [] and fanned.refusal is not None and fanned.refusal.status == 503


async def test_merge_keeps_every_answer_failures_included() -> None:
    fanned = await _ask_listing_peers((200, b'{"replicas": []}'), (500, b'{"error": "x"}'), policy="merge")
    assert fanned.refusal is None
    assert sorted(peer.answer.status for peer in fanned.answers) == [200, 500]
