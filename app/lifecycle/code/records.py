"""Per-record lifecycle of the code group: a pure state machine over the record's events.

Each ``apply_*``/``*_finished``/``*_confirmed`` function takes the stored state (or ``None``) and
one event and returns the new state; it never mutates its input. Facts are merged, not replayed
blindly: an event that arrives early (a chain receipt before the review result) is kept and the
status is derived from everything known, and an event seen before (same ``event_id``) is a no-op.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.lifecycle.code.avcc_code import issue_code
from app.platform.faust.dedup import SeenEvents
from app.platform.topics import APPLY_CREATED, CHAIN_TX_CONFIRMED, CODE_REVIEW_FINISHED, REVIEW_TASK_FINISHED
from schemas.apply import ApplyCreated
from schemas.chain import ChainTxConfirmed
from schemas.envelope import Envelope
from schemas.review import ReviewTaskFinished

__all__ = [
    "HISTORY_LIMIT",
    "SEEN",
    "HistoryEntry",
    "RecordState",
    "RecordStatus",
    "apply_created",
    "capped",
    "is_duplicate",
    "review_finished",
    "tx_confirmed",
]

RecordStatus = Literal["submitted", "need_human", "approved", "rejected", "chain_failed", "issued"]

#: Processed event ids of a record, kept as long as the topics the record's events come from
#: keep them (chain.tx.confirmed: 30 days), so any redelivery is recognised. Their number is
#: bounded by the events a record can get: every event id of the lifecycle is derived from its
#: input (apply.created from the claim, review results from the task, receipts from the
#: transaction).
SEEN = SeenEvents.for_inputs(APPLY_CREATED, REVIEW_TASK_FINISHED, CODE_REVIEW_FINISHED, CHAIN_TX_CONFIRMED)
#: Most transitions a record keeps in its history: the first (the application) and the latest
#: ones. A record is read and rewritten whole at every event and its changelog replayed whole, so
#: its size must stay bounded whatever happens to it (a lifecycle takes 3 to 6 transitions).
HISTORY_LIMIT = 16


class HistoryEntry(BaseModel):
    """One transition of the record, time-stamped."""

    model_config = ConfigDict(frozen=True)

    at_ms: int
    status: RecordStatus
    event: str
    event_id: str
    note: str = ""


class RecordState(BaseModel):
    """Everything the code group knows about one record."""

    model_config = ConfigDict(frozen=True)

    avcc_record_id: int
    status: RecordStatus = "submitted"
    request_id: str | None = None
    content_hash: str | None = None
    content_url: str | None = None
    title: str | None = None
    applicant_id: str | None = None
    ai_tool_info: dict[str, str] | None = None
    priority: int | None = None
    decision: str | None = None
    final_level: str | None = None
    overall_score: float | None = None
    report_hash: str | None = None
    review_report_id: int | None = None
    tx_hash: str | None = None
    block_height: int | None = None
    crd_address: str | None = None
    chain_status: str | None = None
    chain_error: str | None = None
    avcc_code: str | None = None
    created_ms: int | None = None
    updated_ms: int | None = None
    history: tuple[HistoryEntry, ...] = ()
    #: Transitions the record has taken (its history keeps the first and the latest only): its
    #: version, one more at every write.
    transitions: int = 0
    seen: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _count_transitions(cls, data: Any) -> Any:
        """A record stored before the count: each of its transitions is in its history."""
        if isinstance(data, dict) and "transitions" not in data:
            return {**data, "transitions": len(data.get("history") or ())}
        return data

    def public(self) -> dict[str, Any]:
        """The record as the HTTP API shows it (without the dedup bookkeeping)."""
        return self.model_dump(exclude={"seen"})


def capped(history: tuple[HistoryEntry, ...]) -> tuple[HistoryEntry, ...]:
    """``history`` with at most :data:`HISTORY_LIMIT` entries: the first and the latest."""
    if len(history) <= HISTORY_LIMIT:
        return history
    return (history[0], *history[len(history) - HISTORY_LIMIT + 1 :])


def is_duplicate(state: RecordState | None, envelope: Envelope[Any]) -> bool:
    """Whether this event id was already applied to the record."""
    return state is not None and SEEN.contains(state.seen, str(envelope.event_id))


def _derive_status(state: RecordState) -> RecordStatus:
    if state.chain_status == "failed":
        return "chain_failed"
    if state.avcc_code is not None:
        return "issued"
    if state.decision in {"approved", "rejected", "need_human"}:
        return state.decision  # type: ignore[return-value]
    return "submitted"


def _maybe_issue(state: RecordState, org: str, node: str) -> RecordState:
    """Issue the AVCC code once every fact it stands for is known: the application (its content
    hash is part of the code body), the approving review and the successful copyright_main
    confirmation. The three arrive on different topics in any order (a chain receipt can overtake
    the review result on its repartition hop), so whichever comes last issues the code, and an
    issued record always shows its review."""
    if (
        state.avcc_code is None
        and state.chain_status == "success"
        and state.decision == "approved"
        and state.content_hash
    ):
        code = issue_code(state.avcc_record_id, state.content_hash, org, node)
        return state.model_copy(update={"avcc_code": code})
    return state


def _transition(
    before: RecordState,
    after: RecordState,
    envelope: Envelope[Any],
    event: str,
    now_ms: int,
    note: str = "",
) -> RecordState:
    status = _derive_status(after)
    entry = HistoryEntry(at_ms=now_ms, status=status, event=event, event_id=str(envelope.event_id), note=note)
    return after.model_copy(
        update={
            "status": status,
            "updated_ms": now_ms,
            "history": capped((*before.history, entry)),
            "transitions": before.transitions + 1,
            "seen": SEEN.remember(before.seen, str(envelope.event_id), now_ms),
        }
    )


def apply_created(
    state: RecordState | None, envelope: Envelope[ApplyCreated], now_ms: int, org: str, node: str
) -> RecordState:
    """The application passed pre-check: fill the record's application facts; the record was
    created when the application was accepted (the event's time)."""
    p = envelope.payload
    before = state or RecordState(avcc_record_id=p.avcc_record_id, created_ms=now_ms)
    after = before.model_copy(
        update={
            "request_id": p.request_id,
            "content_hash": p.content_hash,
            "content_url": p.content_url,
            "title": p.title,
            "applicant_id": p.applicant_id,
            "ai_tool_info": p.ai_tool_info.model_dump(),
            "priority": p.priority,
            "created_ms": envelope.timestamp,
        }
    )
    after = _maybe_issue(after, org, node)
    return _transition(before, after, envelope, "apply.created", now_ms)


def review_finished(
    state: RecordState | None, envelope: Envelope[ReviewTaskFinished], now_ms: int, org: str, node: str
) -> RecordState:
    """A review result: the final one (approved/rejected) wins over ``need_human``; a final
    result is never overwritten by a later one."""
    p = envelope.payload
    before = state or RecordState(avcc_record_id=p.avcc_record_id, created_ms=now_ms)
    if before.decision in {"approved", "rejected"}:
        note = f"ignored {p.decision}: review already final ({before.decision})"
        return _transition(before, before, envelope, "review.task.finished", now_ms, note)
    after = before.model_copy(
        update={
            "request_id": before.request_id or p.request_id,
            "decision": p.decision,
            "final_level": p.final_level,
            "overall_score": p.overall_score,
            "report_hash": p.report_hash,
            "review_report_id": p.review_report_id,
        }
    )
    return _transition(before, _maybe_issue(after, org, node), envelope, "review.task.finished", now_ms)


def tx_confirmed(
    state: RecordState | None, envelope: Envelope[ChainTxConfirmed], now_ms: int, org: str, node: str
) -> RecordState:
    """A copyright_main receipt: success issues the code (once); failure marks the record."""
    p = envelope.payload
    before = state or RecordState(avcc_record_id=p.avcc_record_id, created_ms=now_ms)
    if before.chain_status == "success":
        note = "ignored: chain confirmation already recorded"
        return _transition(before, before, envelope, "chain.tx.confirmed", now_ms, note)
    after = before.model_copy(
        update={
            "tx_hash": p.tx_hash,
            "block_height": p.block_height,
            "crd_address": p.crd_address,
            "chain_status": p.status,
            "chain_error": p.error,
        }
    )
    return _transition(before, _maybe_issue(after, org, node), envelope, "chain.tx.confirmed", now_ms)
