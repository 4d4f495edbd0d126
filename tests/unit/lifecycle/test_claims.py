"""Claims of applications: record ids, answers to repeated and conflicting applications."""

from __future__ import annotations

import hashlib
import uuid

from app.lifecycle.code.claims import (
    EVENT_NS,
    ID_BASE,
    ID_STRIDE,
    Claim,
    ClaimSequence,
    answer_existing,
    application_answer,
    apply_created_for,
    plan_claims,
    record_id_for,
    sequence_key,
)
from app.platform.topics import APPLY_CREATED
from schemas.application import ApplicationRequest

HASH = "sha256:" + hashlib.sha256(b"work").hexdigest()
CLAIM = Claim(avcc_record_id=10_066, request_id="req_1", claimed_ms=5)


def test_record_ids_never_collide_across_partitions() -> None:
    ids = {record_id_for(seq, partition) for seq in range(100) for partition in range(ID_STRIDE)}
    assert len(ids) == 100 * ID_STRIDE and min(ids) == ID_BASE
    assert record_id_for(1, 2) == ID_BASE + ID_STRIDE + 2
    assert sequence_key(3) == "__seq__:3"


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
        "existing_request_id": "req_1",
    }
    assert application_answer("req_1", same.as_reply()) == (
        202,
        {"request_id": "req_1", "avcc_record_id": 10_066, "status": "submitted"},
    )


def test_claims_are_stored_as_before() -> None:
    assert CLAIM.model_dump_json() == '{"avcc_record_id":10066,"request_id":"req_1","claimed_ms":5}'
    assert ClaimSequence(3).model_dump_json() == "3"
    assert ClaimSequence.model_validate_json(b"4").root == 4


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


def test_a_run_of_claims_numbers_new_records_and_answers_repeats_from_the_run() -> None:
    def app(n: int, work: int) -> ApplicationRequest:
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

    stored = {"sha256:" + f"{9:064x}": Claim(avcc_record_id=42, request_id="req_old", claimed_ms=1)}
    run = [app(1, 1), app(2, 9), app(1, 1), app(3, 1), app(4, 2)]
    plan = plan_claims(run, stored.get, sequence=7, partition=3, now_ms=5)
    assert [(a.http_status, a.claim.avcc_record_id) for a in plan.answers] == [
        (202, record_id_for(7, 3)),
        (409, 42),
        (202, record_id_for(7, 3)),
        (409, record_id_for(7, 3)),
        (202, record_id_for(8, 3)),
    ]
    assert plan.sequence == 9
    assert [e.avcc_record_id for e in plan.events] == [record_id_for(7, 3), record_id_for(8, 3)]
    assert set(plan.made) == {"sha256:" + f"{1:064x}", "sha256:" + f"{2:064x}"}
