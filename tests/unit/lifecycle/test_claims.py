"""Claims of applications: record ids, answers to repeated and conflicting applications."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from app.lifecycle.code.claims import (
    CLAIM_SLOTS,
    EVENT_NS,
    ID_BASE,
    ID_STRIDE,
    Claim,
    answer_existing,
    application_answer,
    apply_created_for,
    plan_claims,
    record_id_for,
)
from app.platform.topics import APPLY_CREATED
from schemas.application import ApplicationRequest

HASH = "sha256:" + hashlib.sha256(b"work").hexdigest()
CLAIM = Claim(avcc_record_id=10_066, request_id="req_1", claimed_ms=5)


def test_record_ids_never_collide_across_partitions_offsets_or_slots() -> None:
    ids = {
        record_id_for(offset, slot, partition)
        for offset in range(20)
        for slot in (0, 1, 2, CLAIM_SLOTS - 1)
        for partition in range(ID_STRIDE)
    }
    assert len(ids) == 20 * 4 * ID_STRIDE and min(ids) == ID_BASE
    assert record_id_for(1, 0, 2) == ID_BASE + CLAIM_SLOTS * ID_STRIDE + 2
    assert record_id_for(0, 1, 2) == ID_BASE + ID_STRIDE + 2
    assert record_id_for(10**12, CLAIM_SLOTS - 1, ID_STRIDE - 1) < 2**63  # fits a signed 64-bit id


@pytest.mark.parametrize(
    ("offset", "slot", "partition"), [(-1, 0, 0), (0, CLAIM_SLOTS, 0), (0, 0, ID_STRIDE)]
)
def test_no_record_id_outside_the_slots(offset: int, slot: int, partition: int) -> None:
    with pytest.raises(ValueError, match="no record id"):
        record_id_for(offset, slot, partition)


def test_same_request_gets_its_record_another_a_conflict() -> None:
    same = answer_existing(CLAIM, "req_1")
    other = answer_existing(CLAIM, "req_2")
    assert (same.http_status, other.http_status) == (202, 409)
    assert same.as_reply() == {
        "http_status": 202,
        "note": "same request_id: the existing record",
        "avcc_record_id": 10_066,
        "request_id": "req_1",
        "claimed_ms": 5,
    }
    status, body = application_answer("req_2", other.as_reply())
    assert status == 409
    assert body == {
        "request_id": "req_2",
        "avcc_record_id": 10_066,
        "status": "conflict",
        "error": "content_hash already registered",
        "reason": "content_hash_taken",
        "existing_request_id": "req_1",
    }
    assert application_answer("req_1", same.as_reply()) == (
        202,
        {"request_id": "req_1", "avcc_record_id": 10_066, "status": "submitted"},
    )


def test_claims_are_stored_as_before() -> None:
    assert CLAIM.model_dump_json() == '{"avcc_record_id":10066,"request_id":"req_1","claimed_ms":5}'


def test_a_new_claim_emits_apply_created_with_a_stable_id() -> None:
    application = ApplicationRequest.model_validate(
        {
            "request_id": "req_1",
            "content_url": "oss://bucket/works/1.mp4",
            "content_hash": HASH,
            "ai_tool_info": {"model_name": "Stable-Diffusion-XL", "model_version": "1.0.2"},
            "priority": 5,
            "title": "Sunrise",
            "applicant_id": "alice",
        }
    )
    out = apply_created_for(application, 10_066)
    assert out.topic == APPLY_CREATED and out.avcc_record_id == 10_066
    assert out.envelope.payload.content_hash == HASH  # type: ignore[attr-defined]
    assert out.envelope.event_id == uuid.uuid5(EVENT_NS, "apply.created:10066")


def _application(n: int, work: int) -> ApplicationRequest:
    """Application ``req_<n>`` of work number ``work``."""
    return ApplicationRequest.model_validate(
        {
            "request_id": f"req_{n}",
            "content_url": "s3://works/clip.mp4",
            "content_hash": "sha256:" + f"{work:064x}",
            "ai_tool_info": {"model_name": "m", "model_version": "v1"},
            "title": "t",
            "applicant_id": "a",
        }
    )


def test_a_run_of_claims_numbers_new_records_and_answers_repeats_from_the_run() -> None:
    stored = {"sha256:" + f"{9:064x}": Claim(avcc_record_id=42, request_id="req_old", claimed_ms=1)}
    run = [_application(1, 1), _application(2, 9), _application(1, 1), _application(3, 1), _application(4, 2)]
    plan = plan_claims(run, stored.get, offset=7, partition=3, now_ms=5)
    assert [(a.http_status, a.claim.avcc_record_id) for a in plan.answers] == [
        (202, record_id_for(7, 0, 3)),
        (409, 42),
        (202, record_id_for(7, 0, 3)),
        (409, record_id_for(7, 0, 3)),
        (202, record_id_for(7, 4, 3)),
    ]
    assert [e.avcc_record_id for e in plan.events] == [record_id_for(7, 0, 3), record_id_for(7, 4, 3)]
    assert set(plan.made) == {"sha256:" + f"{1:064x}", "sha256:" + f"{2:064x}"}


def test_a_request_processed_again_without_its_claims_gives_the_ids_of_its_first_time() -> None:
    """A new owner that recovered none of a request's claim writes hands out the same ids for it,
    and the next request never one of them (a counter in the table did: a duplicate id)."""
    run = [_application(1, 1), _application(2, 2)]
    first = plan_claims(run, {}.get, offset=11, partition=5, now_ms=1)
    again = plan_claims(run, {}.get, offset=11, partition=5, now_ms=2)
    later = plan_claims([_application(3, 3)], {}.get, offset=12, partition=5, now_ms=3)
    ids = [e.avcc_record_id for e in first.events]
    assert [e.avcc_record_id for e in again.events] == ids
    assert [e.envelope.event_id for e in again.events] == [e.envelope.event_id for e in first.events]
    assert later.events[0].avcc_record_id not in ids


def test_a_request_beyond_the_slots_is_refused() -> None:
    run = [_application(n, n) for n in range(CLAIM_SLOTS + 1)]
    with pytest.raises(ValueError, match="at most"):
        plan_claims(run, {}.get, offset=0, partition=0, now_ms=1)
