"""Payload of ``topic.internal.review.decision``: a human reviewer's final decision."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import StringConstraints

from schemas.types import ContractModel, FinalLevel, Identifier, RecordId

__all__ = ["HumanDecision", "HumanDecisionRequest"]


class HumanDecisionRequest(ContractModel):
    """Body of ``POST /v1/review/tasks/{avcc_record_id}/decision``."""

    decision: Literal["approve", "reject"]
    final_level: FinalLevel
    reviewer: Identifier
    reason: Annotated[str, StringConstraints(min_length=1, max_length=2000)]


class HumanDecision(HumanDecisionRequest):
    """A reviewer's decision on a ``need_human`` task, as an event."""

    avcc_record_id: RecordId
    decision_id: Identifier
    #: The API key that signed the decision (the reviewer name is what the caller says; the key
    #: is what authenticated it). Absent on decisions recorded before keys were kept.
    decided_by_key: Identifier | None = None
