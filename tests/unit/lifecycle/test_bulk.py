"""The bulk route's logic: reading a batch (array/NDJSON), per-item answers, claims, admission."""

from __future__ import annotations

import asyncio
import hashlib
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner

from app.lifecycle.code import bulk as bulk_module
from app.lifecycle.code.bulk import THROTTLED, BatchOutcome, PendingClaims, claim_batch, read_batch
from app.platform.http.batch_body import NDJSON, BatchError
from app.platform.http.responses import BadRequest, parse_body
from app.platform.kafka.partitioner import partition_for
from app.platform.topics import CODE_CLAIMS
from schemas.application import ApplicationRequest


def item(i: int, **changes: Any) -> dict[str, Any]:
    body = {
        "request_id": f"req_{i}",
        "content_url": "s3://works/clip.mp4",
        "content_hash": "sha256:" + hashlib.sha256(f"work-{i}".encode()).hexdigest(),
        "ai_tool_info": {"model_name": "Stable-Diffusion-XL", "model_version": "v1.0"},
        "title": f"work {i}",
        "applicant_id": "applicant-1",
    }
    body.update(changes)
    return body


def single_route_400(raw: bytes) -> dict[str, Any]:
    """What ``POST /v1/avcc/applications`` answers for this body (error, reason and fields)."""
    with pytest.raises(BadRequest) as refused:
        parse_body(ApplicationRequest, raw)
    answer = orjson.loads(refused.value.response().body)  # type: ignore[arg-type]
    assert answer == {
        "error": str(refused.value),
        "reason": refused.value.reason,
        "fields": list(refused.value.fields),
    }
    return dict(answer)


def test_array_items_are_validated_one_by_one_with_the_single_route_errors() -> None:
    bad = item(1)
    del bad["title"]
    body = orjson.dumps([item(0), bad, "not an object", item(3, priority=11)])
    valid, refused = read_batch(body, "application/json", 1_000)
    assert [i for i, _ in valid] == [0]
    assert sorted(refused) == [1, 2, 3]
    for index, raw in (
        (1, orjson.dumps(bad)),
        (2, b'"not an object"'),
        (3, orjson.dumps(item(3, priority=11))),
    ):
        assert refused[index] == {"index": index, "http_status": 400, **single_route_400(raw)}
    assert refused[1]["fields"] == ["title"]


def test_ndjson_lines_index_the_non_empty_lines_and_malformed_ones_name_the_body() -> None:
    body = b"\n".join([orjson.dumps(item(0)), b"", b"{not json", orjson.dumps(item(2))]) + b"\n"
    valid, refused = read_batch(body, NDJSON, 1_000)
    assert [(i, a.request_id) for i, a in valid] == [(0, "req_0"), (2, "req_2")]
    assert refused[1]["http_status"] == 400
    assert refused[1]["error"].startswith("body: malformed JSON")
    assert refused[1]["reason"] == "malformed_json"
    assert refused[1]["fields"] == ["body"]


@pytest.mark.parametrize(
    ("body", "content_type", "status", "reason"),
    [
        (b'{"a": 1}', "application/json", 400, "not_an_array"),
        (b"[]", "application/json", 400, "empty_batch"),
        (orjson.dumps([item(i) for i in range(4)]), "application/json", 413, "too_many_items"),
        (b"\n".join(orjson.dumps(item(i)) for i in range(4)), NDJSON, 413, "too_many_items"),
        (b"[]", "text/plain", 415, "unsupported_media_type"),
    ],
)
def test_bodies_that_are_not_a_batch_are_refused_whole(
    body: bytes, content_type: str, status: int, reason: str
) -> None:
    with pytest.raises(BatchError) as refused:
        read_batch(body, content_type, 3)
    assert (refused.value.status, refused.value.reason) == (status, reason)
    if reason == "not_an_array":
        assert "applications" in str(refused.value)


def _reply(status: int, record_id: int, request_id: str) -> dict[str, Any]:
    return {
        "http_status": status,
        "note": "content_hash already registered",
        "avcc_record_id": record_id,
        "request_id": request_id,
        "claimed_ms": 1,
    }


def _parity(application: ApplicationRequest) -> int:
    return int(application.request_id.split("_")[1]) % 2


def test_claims_are_asked_once_per_partition_and_answered_per_item_in_index_order() -> None:
    apps = [(i, ApplicationRequest.model_validate(item(i))) for i in (0, 2, 3, 4, 5)]
    calls: list[tuple[int, list[str]]] = []

    async def ask(partition: int, group: list[ApplicationRequest]) -> list[dict[str, Any]]:
        calls.append((partition, [a.request_id for a in group]))
        if partition == 1 and len(group) == 2:
            raise ConnectionError("broker went away")
        return [
            _reply(409, 77, "req_other") if a.request_id == "req_2" else _reply(202, 100, a.request_id)
            for a in group
        ]

    refused = {1: {"index": 1, "http_status": 400, "error": "title: required", "fields": ["title"]}}
    outcome = asyncio.run(claim_batch(apps, refused, PendingClaims(100, 60.0), ask, _parity, wait_s=5.0))
    assert calls == [(0, ["req_0", "req_2", "req_4"]), (1, ["req_3", "req_5"])]
    assert [a["index"] for a in outcome.items] == [0, 1, 2, 3, 4, 5]
    assert outcome.items[0] == {
        "index": 0,
        "http_status": 202,
        "request_id": "req_0",
        "avcc_record_id": 100,
        "status": "submitted",
    }
    assert outcome.items[2] == {
        "index": 2,
        "http_status": 409,
        "request_id": "req_2",
        "avcc_record_id": 77,
        "status": "conflict",
        "error": "content_hash already registered",
        "reason": "content_hash_taken",
        "existing_request_id": "req_other",
    }
    assert [a["http_status"] for a in outcome.items] == [202, 400, 409, 429, 202, 429]
    assert outcome.items[3]["error"] == THROTTLED
    assert outcome.status == 429
    body = outcome.body()
    assert (body["submitted"], body["conflicts"], body["rejected"], body["throttled"]) == (2, 1, 1, 2)
    assert body["reason"] == "throttled"


def test_the_same_item_twice_in_a_batch_is_asked_once() -> None:
    app = ApplicationRequest.model_validate(item(0))
    calls: list[int] = []

    async def ask(partition: int, group: list[ApplicationRequest]) -> list[dict[str, Any]]:
        calls.append(len(group))
        return [_reply(202, 100, a.request_id) for a in group]

    outcome = asyncio.run(claim_batch([(0, app), (1, app)], {}, PendingClaims(100, 60.0), ask, _parity, 5.0))
    assert [a["avcc_record_id"] for a in outcome.items] == [100, 100]
    assert calls == [1]


def test_a_throttled_claim_goes_on_and_a_resent_item_joins_it_instead_of_asking_again() -> None:
    apps = [(i, ApplicationRequest.model_validate(item(i))) for i in range(3)]
    asked: list[str] = []
    slow = asyncio.Event()

    async def ask(partition: int, group: list[ApplicationRequest]) -> list[dict[str, Any]]:
        asked.extend(a.request_id for a in group)
        if partition == 1:
            await slow.wait()
        return [_reply(202, 5, a.request_id) for a in group]

    async def scenario() -> None:
        pending = PendingClaims(100, 60.0)
        first = await claim_batch(apps, {}, pending, ask, _parity, wait_s=1.0)
        assert [a["http_status"] for a in first.items] == [202, 429, 202]
        assert first.items[1]["request_id"] == "req_1"
        assert len(pending) == 1  # the slow claim is still asked for
        slow.set()
        again = await claim_batch(apps[1:2], {}, pending, ask, _parity, wait_s=5.0)
        assert [a["http_status"] for a in again.items] == [202]
        assert asked == ["req_0", "req_2", "req_1"]  # the resent item joined its first ask
        await asyncio.sleep(0)
        assert len(pending) == 0
        third = await claim_batch(apps, {}, pending, ask, _parity, wait_s=0.0)  # all answered: kept
        assert [a["http_status"] for a in third.items] == [202, 202, 202]
        assert len(asked) == 3

    asyncio.run(scenario())


def test_kept_answers_expire_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    apps = [ApplicationRequest.model_validate(item(i)) for i in range(3)]
    asked: list[str] = []

    async def ask(partition: int, group: list[ApplicationRequest]) -> list[dict[str, Any]]:
        asked.extend(a.request_id for a in group)
        return [_reply(202, 5, a.request_id) for a in group]

    async def one(pending: PendingClaims, application: ApplicationRequest) -> None:
        await pending.ask_all([application], ask, _parity)[0]
        await asyncio.sleep(0)

    now = [1000.0]  # the module's clock, moved by the test (no wall-clock margins)
    monkeypatch.setattr(bulk_module, "time", SimpleNamespace(monotonic=lambda: now[0]))

    async def scenario() -> None:
        pending = PendingClaims(100, 60.0, keep=2, keep_s=0.2)
        for a in apps:
            await one(pending, a)
        await one(pending, apps[0])  # pushed out by the bound: asked again
        now[0] += 0.19
        await one(pending, apps[2])  # kept (until keep_s has passed)
        assert asked == ["req_0", "req_1", "req_2", "req_0"]
        now[0] += 0.02
        await one(pending, apps[2])  # expired: asked again
        assert asked[-1] == "req_2" and len(asked) == 5

    asyncio.run(scenario())


def test_an_ask_is_given_up_after_its_timeout_and_its_slot_freed() -> None:
    app = ApplicationRequest.model_validate(item(0))

    async def never(partition: int, group: list[ApplicationRequest]) -> list[dict[str, Any]]:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    async def scenario() -> None:
        pending = PendingClaims(100, 0.1)
        outcome = await claim_batch([(0, app)], {}, pending, never, _parity, wait_s=1.0)
        assert outcome.items[0]["http_status"] == 429
        await asyncio.sleep(0)
        assert len(pending) == 0

    asyncio.run(scenario())


def test_a_batch_of_final_answers_is_202() -> None:
    outcome = BatchOutcome([{"index": 0, "http_status": 202}, {"index": 1, "http_status": 400}])
    assert outcome.status == 202
    assert "error" not in outcome.body()


def test_pending_claims_admit_new_asks_up_to_the_limit_and_a_lone_oversized_batch() -> None:
    apps = [ApplicationRequest.model_validate(item(i)) for i in range(30)]
    release = asyncio.Event()

    async def ask(partition: int, group: list[ApplicationRequest]) -> list[dict[str, Any]]:
        await release.wait()
        return [_reply(202, 1, a.request_id) for a in group]

    async def scenario() -> None:
        pending = PendingClaims(10, 60.0)
        assert pending.admits(apps[:25])  # idle: admitted, or it could never pass
        pending.ask_all(apps[:6], ask, _parity)
        assert pending.admits(apps[:10])  # 6 pending + 4 new
        assert not pending.admits(apps[:11])
        assert pending.admits(apps[:6])  # resent items need no new slot
        release.set()
        await asyncio.sleep(0.01)
        assert len(pending) == 0

    asyncio.run(scenario())


def test_the_bulk_route_groups_by_the_partition_faust_produces_a_keyed_ask_to() -> None:
    """The single route's ask is keyed by content hash (faust: aiokafka's default partitioner);
    the bulk route addresses the partition itself, and both must meet on the same claims owner."""
    partitions = list(range(CODE_CLAIMS.partitions))
    for i in range(200):
        key = item(i)["content_hash"].encode()
        assert partition_for(key, CODE_CLAIMS.partitions) == DefaultPartitioner()(key, partitions, partitions)
