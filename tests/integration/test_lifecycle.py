"""Core lifecycle on real brokers: apply -> review -> chain -> AVCC code, exactly-once effects."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from app.lifecycle.chain.ledger import verify_ledger
from app.lifecycle.code.avcc_code import verify_check_char
from app.platform.faust.app import consumer_group_id
from app.platform.topics import (
    APPLY_CREATED,
    CHAIN_TX_CONFIRMED,
    CHAIN_TX_PENDING,
    REVIEW_TASK_FINISHED,
)
from tests.integration.reads import end_offsets, read_range, read_to_sentinel, wait_quiescent
from tests.integration.stack import CORE_GROUPS, Stack, application, record_when


async def test_signed_application_gets_code_with_full_history(core_stack: Stack) -> None:
    status, answer = await core_stack.call("code", "POST", "/v1/avcc/applications", application())
    assert status == 202, answer
    assert answer["status"] == "submitted"
    record = await record_when(core_stack, answer["avcc_record_id"], lambda r: r.get("avcc_code"))

    assert record["status"] == "issued"
    assert record["decision"] == "approved" and record["final_level"] == "O"
    assert record["tx_hash"].startswith("0x") and record["block_height"] >= 1
    assert verify_check_char(record["avcc_code"])
    assert record["avcc_code"].startswith("MA.156.10005.8361/")
    # the chain receipt may overtake the review result (one more hop to the code group)
    assert sorted(h["event"] for h in record["history"]) == [
        "apply.created",
        "chain.tx.confirmed",
        "review.task.finished",
    ]
    # the code waits for the approval: an overtaking receipt leaves the record submitted
    assert [h["status"] for h in record["history"]] in (
        ["submitted", "approved", "issued"],
        ["submitted", "submitted", "issued"],
    )
    assert all(h["at_ms"] > 0 for h in record["history"])
    result = verify_ledger(core_stack.data_dir("chain") / "ledger")
    assert result.ok, result.error


async def test_same_request_id_is_idempotent_and_same_work_conflicts(core_stack: Stack) -> None:
    body = application()
    first = await core_stack.call("code", "POST", "/v1/avcc/applications", body)
    again = await core_stack.call("code", "POST", "/v1/avcc/applications", body)
    other = await core_stack.call(
        "code", "POST", "/v1/avcc/applications", {**body, "request_id": f"req_{uuid.uuid4().hex[:12]}"}
    )
    assert first[0] == 202 and again[0] == 202
    assert again[1]["avcc_record_id"] == first[1]["avcc_record_id"]
    assert other[0] == 409
    assert other[1]["avcc_record_id"] == first[1]["avcc_record_id"]


async def test_concurrent_applications_for_one_work_get_one_record(core_stack: Stack) -> None:
    import asyncio

    content_hash = "sha256:" + hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    calls = [
        core_stack.call("code", "POST", "/v1/avcc/applications", application(content_hash=content_hash))
        for _ in range(8)
    ]
    results = await asyncio.gather(*calls)
    statuses = sorted(s for s, _ in results)
    assert statuses.count(202) == 1 and statuses.count(409) == 7, results
    assert len({a["avcc_record_id"] for _, a in results}) == 1


async def test_need_human_waits_for_reviewer_then_completes_or_rejects(core_stack: Stack) -> None:
    unknown_model = {"model_name": "home-made-diffuser", "model_version": "v2.1.0"}
    ids = []
    for _ in range(2):
        status, answer = await core_stack.call(
            "code", "POST", "/v1/avcc/applications", application(ai_tool_info=unknown_model, priority=9)
        )
        assert status == 202, answer
        ids.append(answer["avcc_record_id"])
    for record_id in ids:
        record = await record_when(core_stack, record_id, lambda r: r["status"] == "need_human")
        assert record.get("avcc_code") is None
    status, listing = await core_stack.call_settled("review", "GET", "/v1/review/tasks?status=need_human")
    assert status == 200, listing
    waiting = {t["avcc_record_id"] for t in listing["tasks"]}
    assert set(ids) <= waiting

    approve = {"decision": "approve", "final_level": "G", "reviewer": "rev-1", "reason": "checked provenance"}
    reject = {"decision": "reject", "final_level": "P", "reviewer": "rev-2", "reason": "watermark missing"}
    for record_id, decision in ((ids[0], approve), (ids[1], reject)):
        path = f"/v1/review/tasks/{record_id}/decision"
        assert (await core_stack.call_settled("review", "POST", path, decision))[0] == 202

    issued = await record_when(core_stack, ids[0], lambda r: r.get("avcc_code"))
    assert issued["final_level"] == "G" and issued["status"] == "issued"
    rejected = await record_when(core_stack, ids[1], lambda r: r["status"] == "rejected")
    assert rejected.get("avcc_code") is None and rejected.get("tx_hash") is None
    again = await core_stack.call_settled("review", "POST", f"/v1/review/tasks/{ids[1]}/decision", approve)
    assert again[0] == 409


def _read_all(bootstrap: str, topics: list[str]) -> list[Any]:
    """Every message of ``topics`` up to their end offsets now."""
    return [m for topic in topics for m in read_range(bootstrap, topic)]


def _record_id(message: Any) -> int | None:
    """The ``avcc_record_id`` an event of a core topic is about."""
    try:
        payload = orjson.loads(message.value())["payload"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    value = payload.get("avcc_record_id") if isinstance(payload, dict) else None
    return int(value) if isinstance(value, int) else None


def _replay(bootstrap: str, topics: list[str], record_ids: set[int]) -> int:
    """Re-produce every message of ``topics`` about ``record_ids`` (same partition, key, value,
    headers): each of those events is delivered a second time to every group that consumes it."""
    messages = [m for m in _read_all(bootstrap, topics) if _record_id(m) in record_ids]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for m in messages:
        producer.produce(m.topic(), m.value(), m.key(), partition=m.partition(), headers=m.headers())
    assert producer.flush(30) == 0
    return len(messages)


CORE_GROUP_IDS = [consumer_group_id(group) for group in CORE_GROUPS]


async def test_replaying_every_core_topic_changes_nothing(core_stack: Stack) -> None:
    ids = []
    for _ in range(3):
        status, answer = await core_stack.call("code", "POST", "/v1/avcc/applications", application())
        assert status == 202
        ids.append(answer["avcc_record_id"])
    before = [await record_when(core_stack, i, lambda r: r.get("avcc_code")) for i in ids]
    ledger_path: Path = core_stack.data_dir("chain") / "ledger"
    core = [APPLY_CREATED.name, REVIEW_TASK_FINISHED.name, CHAIN_TX_PENDING.name, CHAIN_TX_CONFIRMED.name]
    # every group past every event on its topics (the applications' too): the ledger holds them all
    await asyncio.to_thread(wait_quiescent, core_stack.bootstrap, CORE_GROUP_IDS)
    txs_before = verify_ledger(ledger_path).transactions

    # only this test's records are replayed: the stack's other records are other tests'
    copied = _replay(core_stack.bootstrap, core, set(ids))
    assert copied >= 12

    # every group has committed the end of every topic it reads, twice in a row: each one has
    # processed every duplicate (of every partition) and whatever a duplicate made it produce
    await asyncio.to_thread(wait_quiescent, core_stack.bootstrap, CORE_GROUP_IDS)

    after = [await record_when(core_stack, i, lambda r: r.get("avcc_code")) for i in ids]
    for old, new in zip(before, after, strict=True):
        assert new["avcc_code"] == old["avcc_code"]
        assert new["tx_hash"] == old["tx_hash"]
        assert new["history"] == old["history"], "a replayed event changed the record"
    # verify_ledger refuses a ledger holding two transactions with one idempotency key, so a
    # replayed submission would fail it; and no transaction was added at all.
    check = verify_ledger(ledger_path)
    assert check.ok, f"a replay submitted a second chain transaction: {check.error}"
    assert check.transactions == txs_before, "a replayed event added a chain transaction"
    confirmed = _read_all(core_stack.bootstrap, [CHAIN_TX_CONFIRMED.name])
    for record in after:
        copies = {m.value() for m in confirmed if m.key() == str(record["avcc_record_id"]).encode()}
        assert len(copies) == 1, "a replay produced a second, different chain confirmation"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda h: {**h, "X-AVCC-Signature": "0" * 64}, "bad_signature"),
        (lambda h: {**h, "X-AVCC-Key": "nobody"}, "bad_signature"),  # unknown keys look like bad ones
        (lambda h: {k: v for k, v in h.items() if k != "X-AVCC-Nonce"}, "missing_header"),
    ],
    ids=["bad-signature", "unknown-key", "missing-nonce"],
)
async def test_bad_signatures_get_401_and_produce_nothing(
    core_stack: Stack, mutate: Any, reason: str
) -> None:
    from app.platform.http.auth import sign_request
    from tests.integration.stack import API_KEY, API_SECRET

    body = application()
    raw = orjson.dumps(body)
    headers = mutate(sign_request("POST", "/v1/avcc/applications", raw, API_KEY, API_SECRET))
    since = end_offsets(core_stack.bootstrap, APPLY_CREATED.name)
    status, answer = await core_stack.call(
        "code", "POST", "/v1/avcc/applications", raw=raw, signed=False, headers=headers
    )
    assert status == 401 and answer["reason"] == reason
    assert await _applications_before_sentinel(core_stack, body["request_id"], since) == 0


async def test_replayed_nonce_and_skewed_timestamp_get_401(core_stack: Stack) -> None:
    from app.platform.http.auth import sign_request
    from tests.integration.stack import API_KEY, API_SECRET

    body = application()
    raw = orjson.dumps(body)
    headers = sign_request("POST", "/v1/avcc/applications", raw, API_KEY, API_SECRET)
    ok = await core_stack.call(
        "code", "POST", "/v1/avcc/applications", raw=raw, signed=False, headers=headers
    )
    assert ok[0] == 202
    replay = await core_stack.call(
        "code", "POST", "/v1/avcc/applications", raw=raw, signed=False, headers=headers
    )
    assert replay[0] == 401 and replay[1]["reason"] == "replayed_nonce"
    skewed = sign_request(
        "POST",
        "/v1/avcc/applications",
        raw,
        API_KEY,
        API_SECRET,
        timestamp_ms=int(time.time() * 1000) - 600_000,
    )
    stale = await core_stack.call(
        "code", "POST", "/v1/avcc/applications", raw=raw, signed=False, headers=skewed
    )
    assert stale[0] == 401 and stale[1]["reason"] == "stale_timestamp"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("content_hash", "sha256:abc123"),
        ("priority", 12),
        ("ai_tool_info", {"model_name": "x"}),
        ("content_url", "ftp://example.org/x"),
    ],
)
async def test_malformed_bodies_get_400_naming_the_field(core_stack: Stack, field: str, value: Any) -> None:
    body = application(**{field: value})
    since = end_offsets(core_stack.bootstrap, APPLY_CREATED.name)
    status, answer = await core_stack.call("code", "POST", "/v1/avcc/applications", body)
    assert status == 400
    assert field in answer["error"]
    assert any(f.startswith(field) for f in answer["fields"])
    assert await _applications_before_sentinel(core_stack, body["request_id"], since) == 0


async def test_malformed_json_and_missing_fields_get_400(core_stack: Stack) -> None:
    status, answer = await core_stack.call("code", "POST", "/v1/avcc/applications", raw=b"{not json")
    assert status == 400 and "body" in answer["fields"]
    body = application()
    del body["content_hash"]
    status, answer = await core_stack.call("code", "POST", "/v1/avcc/applications", body)
    assert status == 400 and "content_hash" in answer["fields"]


async def _applications_before_sentinel(stack: Stack, request_id: str, since: dict[int, int]) -> int:
    """apply.created events carrying ``request_id`` since ``since``, read to a sentinel: a valid
    application sent after the refused one through the same code worker; every event the refused
    request could have produced is on the topic before the sentinel's."""
    sentinel = application()
    status, answer = await stack.call("code", "POST", "/v1/avcc/applications", sentinel)
    assert status == 202, answer
    marker = sentinel["request_id"].encode()
    messages = await asyncio.to_thread(
        read_to_sentinel,
        stack.bootstrap,
        APPLY_CREATED.name,
        lambda m: marker in (m.value() or b""),
        start=since,
    )
    return sum(1 for m in messages if request_id.encode() in (m.value() or b""))
