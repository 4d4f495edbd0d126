"""Claims of applications: one work (content hash), one record, one code.

The claims agent owns a content hash's partition; for each application it either finds the
hash's claim (same ``request_id``: the same record again; another: a conflict) or claims it with
a new record id. A record id is derived from where its claim request sits in the claims topic:
``ID_BASE + (offset * CLAIM_SLOTS + slot) * ID_STRIDE + partition`` (``slot``: the
application's place in the request). Workers owning different partitions never hand out the
same id, and a request processed again -- after a crash, or by the next owner of its partition
after a rebalance -- gives every application the id it got the first time, whatever part of
the claims table's changelog the new owner recovered. (A counter kept in the table did not: a
new owner that recovered it without its last writes handed out an id that was already taken.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel

from app.platform.faust.effects import Outgoing
from app.platform.topics import APPLY_CREATED
from schemas.application import ApplicationRequest
from schemas.apply import ApplyCreated
from schemas.envelope import make_envelope

__all__ = [
    "CLAIM_SLOTS",
    "CLAIM_TIMEOUT_S",
    "EVENT_NS",
    "ID_BASE",
    "ID_STRIDE",
    "Claim",
    "ClaimAnswer",
    "ClaimPlan",
    "answer_existing",
    "application_answer",
    "apply_created_for",
    "plan_claims",
    "record_id_for",
]

#: Namespace of the code group's name-based (deterministic) event ids.
EVENT_NS: Final = uuid.UUID("6f1c3c0e-6d59-4f43-9a51-8f3f0a7c2a01")
ID_BASE: Final = 10_000
ID_STRIDE: Final = 64
#: Most applications one claim request carries (the bulk route's batch size is bounded by it).
CLAIM_SLOTS: Final = 1024
#: How long the HTTP view waits for the claims agent before answering 503.
CLAIM_TIMEOUT_S: Final = 15.0


class Claim(BaseModel):
    """A claimed content hash: its record and the request that claimed it."""

    avcc_record_id: int
    request_id: str
    claimed_ms: int


@dataclass(frozen=True, slots=True)
class ClaimAnswer:
    """What the claims agent answers: the HTTP status, why, and the claim."""

    http_status: int
    note: str
    claim: Claim

    def as_reply(self) -> dict[str, Any]:
        """The JSON reply sent back to the asking view (faust ask/reply)."""
        return {"http_status": self.http_status, "note": self.note, **self.claim.model_dump()}


def record_id_for(offset: int, slot: int, partition: int) -> int:
    """The record id of the application in ``slot`` of the claim request at ``offset`` of claims
    ``partition``."""
    if not (0 <= slot < CLAIM_SLOTS and 0 <= partition < ID_STRIDE and offset >= 0):
        raise ValueError(f"no record id for offset {offset}, slot {slot}, partition {partition}")
    return ID_BASE + (offset * CLAIM_SLOTS + slot) * ID_STRIDE + partition


def answer_existing(claim: Claim, request_id: str) -> ClaimAnswer:
    """The answer to an application whose content hash is claimed already."""
    if claim.request_id == request_id:
        return ClaimAnswer(202, "same request_id: the existing record", claim)
    return ClaimAnswer(409, "content_hash already registered", claim)


def apply_created_for(application: ApplicationRequest, record_id: int) -> Outgoing:
    """The ``apply.created`` event of a newly claimed application (same record -> same event id)."""
    payload = ApplyCreated(
        request_id=application.request_id,
        avcc_record_id=record_id,
        content_url=application.content_url,
        content_hash=application.content_hash,
        ai_tool_info=application.ai_tool_info,
        priority=application.priority,
        title=application.title,
        applicant_id=application.applicant_id,
        media_type=application.media_type,
    )
    envelope = make_envelope(
        payload, source="code-svc", event_id=uuid.uuid5(EVENT_NS, f"apply.created:{record_id}")
    )
    return Outgoing(APPLY_CREATED, envelope, record_id)


@dataclass(slots=True)
class ClaimPlan:
    """What claiming a run of applications on one partition takes: the answers (in order), the
    events to produce, the claims to store once they are acknowledged."""

    answers: list[ClaimAnswer] = field(default_factory=list)
    events: list[Outgoing] = field(default_factory=list)
    made: dict[str, Claim] = field(default_factory=dict)


def plan_claims(
    applications: Sequence[ApplicationRequest],
    stored: Callable[[str], Claim | None],
    offset: int,
    partition: int,
    now_ms: int,
) -> ClaimPlan:
    """Claim ``applications``, the claim request at ``offset`` of ``partition``, in order
    (``stored``: the claims table): a known content hash -- stored, or claimed earlier in the
    same request -- is answered from its claim, a new one gets the id of its slot and its
    ``apply.created`` event."""
    if len(applications) > CLAIM_SLOTS:
        raise ValueError(f"a claim request carries at most {CLAIM_SLOTS} applications")
    plan = ClaimPlan()
    for slot, application in enumerate(applications):
        existing = plan.made.get(application.content_hash) or stored(application.content_hash)
        if existing is not None:
            plan.answers.append(answer_existing(existing, application.request_id))
            continue
        record_id = record_id_for(offset, slot, partition)
        plan.events.append(apply_created_for(application, record_id))
        claim = Claim(avcc_record_id=record_id, request_id=application.request_id, claimed_ms=now_ms)
        plan.made[application.content_hash] = claim
        plan.answers.append(ClaimAnswer(202, "created", claim))
    return plan


def application_answer(request_id: str, reply: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Status and body of ``POST /v1/avcc/applications`` for the claims agent's ``reply``."""
    status = int(reply["http_status"])
    answer: dict[str, Any] = {
        "request_id": request_id,
        "avcc_record_id": int(reply["avcc_record_id"]),
        "status": "submitted" if status == 202 else "conflict",
    }
    if status == 409:
        answer["error"] = reply["note"]
        answer["reason"] = "content_hash_taken"
        answer["existing_request_id"] = reply["request_id"]
    return status, answer
