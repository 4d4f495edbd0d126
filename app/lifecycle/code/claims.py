"""Claims of applications: one work (content hash), one record, one code.

The claims agent owns a content hash's partition; for each application it either finds the
hash's claim (same ``request_id``: the same record again; another: a conflict) or claims it with
a new record id. Record ids are ``ID_BASE + sequence * ID_STRIDE + partition``, so workers owning
different partitions never hand out the same id.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, RootModel

from app.platform.faust.effects import Outgoing
from app.platform.topics import APPLY_CREATED
from schemas.application import ApplicationRequest
from schemas.apply import ApplyCreated
from schemas.envelope import make_envelope

__all__ = [
    "CLAIM_TIMEOUT_S",
    "EVENT_NS",
    "ID_BASE",
    "ID_STRIDE",
    "Claim",
    "ClaimAnswer",
    "ClaimPlan",
    "ClaimSequence",
    "answer_existing",
    "application_answer",
    "apply_created_for",
    "plan_claims",
    "record_id_for",
    "sequence_key",
]

#: Namespace of the code group's name-based (deterministic) event ids.
EVENT_NS: Final = uuid.UUID("6f1c3c0e-6d59-4f43-9a51-8f3f0a7c2a01")
ID_BASE: Final = 10_000
ID_STRIDE: Final = 64
#: How long the HTTP view waits for the claims agent before answering 503.
CLAIM_TIMEOUT_S: Final = 15.0


class Claim(BaseModel):
    """A claimed content hash: its record and the request that claimed it."""

    avcc_record_id: int
    request_id: str
    claimed_ms: int


class ClaimSequence(RootModel[int]):
    """Record ids handed out so far by one claims partition."""


@dataclass(frozen=True, slots=True)
class ClaimAnswer:
    """What the claims agent answers: the HTTP status, why, and the claim."""

    http_status: int
    note: str
    claim: Claim

    def as_reply(self) -> dict[str, Any]:
        """The JSON reply sent back to the asking view (faust ask/reply)."""
        return {"http_status": self.http_status, "note": self.note, **self.claim.model_dump()}


def sequence_key(partition: int) -> str:
    """Key of the record-id sequence of a claims partition (kept in the claims table)."""
    return f"__seq__:{partition}"


def record_id_for(sequence: int, partition: int) -> int:
    """The record id the ``sequence``-th claim of ``partition`` gets."""
    return ID_BASE + sequence * ID_STRIDE + partition


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
    events to produce, the claims to store once they are acknowledged, the next sequence."""

    answers: list[ClaimAnswer] = field(default_factory=list)
    events: list[Outgoing] = field(default_factory=list)
    made: dict[str, Claim] = field(default_factory=dict)
    sequence: int = 0


def plan_claims(
    applications: Sequence[ApplicationRequest],
    stored: Callable[[str], Claim | None],
    sequence: int,
    partition: int,
    now_ms: int,
) -> ClaimPlan:
    """Claim ``applications`` in order on ``partition`` (``stored``: the claims table): a known
    content hash -- stored, or claimed earlier in the same run -- is answered from its claim, a
    new one gets the next record id and its ``apply.created`` event."""
    plan = ClaimPlan(sequence=sequence)
    for application in applications:
        existing = plan.made.get(application.content_hash) or stored(application.content_hash)
        if existing is not None:
            plan.answers.append(answer_existing(existing, application.request_id))
            continue
        record_id = record_id_for(plan.sequence, partition)
        plan.sequence += 1
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
        answer["existing_request_id"] = reply["request_id"]
    return status, answer
