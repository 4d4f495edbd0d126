"""Payload of ``topic.review.task.finished``: an AI/human review result (seed 9.2.2)."""

from __future__ import annotations

from schemas.types import (
    ContractModel,
    Decision,
    FinalLevel,
    Identifier,
    RecordId,
    Score,
    Sha256Ref,
)

__all__ = ["ReviewTaskFinished"]


class ReviewTaskFinished(ContractModel):
    """A review produced its report (review-svc -> chain-svc, code-svc)."""

    request_id: Identifier
    avcc_record_id: RecordId
    review_report_id: RecordId
    decision: Decision
    final_level: FinalLevel
    #: Finite JSON number in [0, 100] (booleans refused).
    overall_score: Score
    report_hash: Sha256Ref
    #: Extension: the reviewed work's hash, so chain-svc can notarise without a join on
    #: apply.created (12 vs 6 partitions). Optional: the seed's payload stays valid.
    content_hash: Sha256Ref | None = None
    #: Extension: the applicant, carried into the evidence transaction.
    applicant_id: Identifier | None = None
