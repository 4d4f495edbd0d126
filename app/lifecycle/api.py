"""The ``/v1/`` routes of the record lifecycle (applications, records, review, settlement),
declared once (:class:`~app.platform.http.openapi.Operation`); :mod:`app.api` merges every domain's
routes for partners."""

from __future__ import annotations

from typing import Any, Final

from app.lifecycle.code.records import RecordState
from app.lifecycle.review.listing import CURSOR_PATTERN, MAX_LIMIT
from app.lifecycle.review.tasks import ReviewTask
from app.lifecycle.settlement.clearing import Clearing, InstructionRequest
from app.platform.http.openapi import EPOCH_MS, INTEGER, STRING, Body, Operation, Param, Reply
from schemas.application import ApplicationRequest
from schemas.decision import HumanDecisionRequest
from schemas.types import IDENTIFIER_PATTERN

__all__ = [
    "APPLY",
    "APPLY_BATCH",
    "DECIDE",
    "INSTRUCTION",
    "OPERATIONS",
    "RECORD",
    "RECORD_COUNTS",
    "SUBMIT_INSTRUCTION",
    "TASKS",
    "TIME_TO_CODE",
]

_RECORD_ID = Param(
    "avcc_record_id",
    {"type": "string", "pattern": "^[0-9]{1,19}$"},
    "Record id (decimal integer).",
    where="path",
)
_DECISION_ACCEPTED: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["avcc_record_id", "status", "event_id"],
    "properties": {"avcc_record_id": INTEGER, "status": {"const": "accepted"}, "event_id": STRING},
}

APPLY = Operation(
    "POST",
    "/v1/avcc/applications",
    "Apply for an AVCC code (idempotent per request_id; one record per content_hash).",
    (
        Reply(
            202,
            "Submitted (also the answer to a retry with the same request_id).",
            {
                "type": "object",
                "required": ["request_id", "avcc_record_id", "status"],
                "properties": {
                    "request_id": STRING,
                    "avcc_record_id": INTEGER,
                    "status": {"const": "submitted"},
                },
            },
        ),
    ),
    scope="apply",
    body=Body(ApplicationRequest),
    errors=(409,),
    tag="records",
)
_BATCH_ITEM: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["index", "http_status"],
    "properties": {
        "index": INTEGER,
        "http_status": {"enum": [202, 400, 409, 429]},
        "request_id": STRING,
        "avcc_record_id": INTEGER,
        "status": {"enum": ["submitted", "conflict"]},
        "error": STRING,
        "reason": STRING,
        "fields": {"type": "array", "items": STRING},
        "existing_request_id": STRING,
    },
    "description": "What the single route would answer for this item (its status in http_status); "
    "429 items were not claimed in time and are resent as they are.",
}
APPLY_BATCH = Operation(
    "POST",
    "/v1/avcc/applications:batch",
    "Apply for up to 1,000 works at once (a JSON array; NDJSON as application/x-ndjson is also "
    "accepted); each item is answered like POST /v1/avcc/applications.",
    (
        Reply(
            202,
            "Every item has its final answer (submitted, conflict or invalid).",
            {
                "type": "object",
                "required": ["submitted", "conflicts", "rejected", "throttled", "items"],
                "properties": {
                    "submitted": INTEGER,
                    "conflicts": INTEGER,
                    "rejected": INTEGER,
                    "throttled": INTEGER,
                    "items": {"type": "array", "items": _BATCH_ITEM},
                },
            },
        ),
    ),
    scope="apply",
    body=Body(ApplicationRequest, array=True),
    errors=(415, 429),
    tag="records",
)
RECORD = Operation(
    "GET",
    "/v1/avcc/records/{avcc_record_id}",
    "A record with its history.",
    (Reply(200, "The record.", RecordState),),
    scope="records:read",
    params=(_RECORD_ID,),
    errors=(404,),
    tag="records",
)
_REPLICA_COUNTS: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["url", "partitions", "answered"],
    "properties": {
        "url": {**STRING, "description": "The replica's advertised base URL."},
        "partitions": {"type": "array", "items": INTEGER, "description": "The record partitions it holds."},
        "answered": {"type": "boolean"},
        "counts": {
            "type": "object",
            "additionalProperties": INTEGER,
            "description": "Its records by status.",
        },
        "error": {**STRING, "description": "Why it did not answer."},
    },
}
RECORD_COUNTS = Operation(
    "GET",
    "/v1/avcc/record-counts",
    "Records by status over every record partition, answered the same by any code replica: it "
    "merges the counts of every replica holding record partitions (the console's overview).",
    (
        Reply(
            200,
            "Counts by status summed over the replicas that answered; every replica with its "
            "partitions; the partitions nobody counted (a replica that did not answer is named in "
            "replicas with answered false). truncated is always false (counts are kept, not scanned).",
            {
                "type": "object",
                "required": ["counts", "truncated"],
                "properties": {
                    "counts": {"type": "object", "additionalProperties": INTEGER},
                    "truncated": {"type": "boolean"},
                    "partitions": {**INTEGER, "description": "Record partitions in all."},
                    "missing_partitions": {"type": "array", "items": INTEGER},
                    "replicas": {"type": "array", "items": _REPLICA_COUNTS},
                },
            },
        ),
    ),
    scope="records:read",
    errors=(503,),
    tag="records",
)
_NUMBER: Final = {"type": "number"}
_TIME_TO_CODE_SERIES: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["level", "outcome", "review", "buckets", "sum"],
    "properties": {
        "level": {**STRING, "description": "The record's final_level (unknown: failed before its review)."},
        "outcome": {"enum": ["issued", "rejected", "chain_failed"]},
        "review": {"enum": ["ai", "human"], "description": "human: a person decided."},
        "buckets": {
            "type": "array",
            "items": INTEGER,
            "description": "Records answered within each of bounds, then in all (cumulative, as "
            "Prometheus's le buckets).",
        },
        "sum": {**_NUMBER, "description": "Seconds in all."},
    },
}
_TIME_TO_CODE_STAGE: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["level", "stage", "count", "sum"],
    "properties": {
        "level": STRING,
        "stage": {"enum": ["code", "review", "human_wait", "chain"]},
        "count": INTEGER,
        "sum": {**_NUMBER, "description": "Seconds the records spent in the stage."},
    },
}
_TIME_TO_CODE_WINDOW: Final[dict[str, Any]] = {
    "series": {"type": "array", "items": _TIME_TO_CODE_SERIES},
    "stages": {"type": "array", "items": _TIME_TO_CODE_STAGE},
    "oldest_need_human_ms": {
        "type": ["integer", "null"],
        "description": "Since when (epoch ms) the longest-waiting need_human record waits for a "
        "person; null when none does.",
    },
}
TIME_TO_CODE = Operation(
    "GET",
    "/v1/avcc/time-to-code",
    "Time to code of the last hour (application accepted to code issued, refusal or chain failure, "
    "once per record) per level, outcome and stage, and the oldest record waiting for a person, "
    "answered the same by any code replica: it adds up every replica holding record partitions "
    "(the console's overview; the same observations as the avcc_time_to_code_seconds histograms).",
    (
        Reply(
            200,
            "The replicas that answered added up; every replica with its partitions and its own "
            "part; the record partitions whose waits nobody reported.",
            {
                "type": "object",
                "required": ["window_s", "bounds", "series", "stages", "oldest_need_human_ms", "replicas"],
                "properties": {
                    "window_s": {**INTEGER, "description": "How far back the answers reach."},
                    "bounds": {
                        "type": "array",
                        "items": _NUMBER,
                        "description": "Upper bounds (s) of the buckets, +Inf left out.",
                    },
                    **_TIME_TO_CODE_WINDOW,
                    "partitions": {**INTEGER, "description": "Record partitions in all."},
                    "missing_partitions": {"type": "array", "items": INTEGER},
                    "replicas": {
                        "type": "array",
                        "items": {
                            **_REPLICA_COUNTS,
                            "properties": {
                                **{k: v for k, v in _REPLICA_COUNTS["properties"].items() if k != "counts"},
                                **_TIME_TO_CODE_WINDOW,
                            },
                        },
                    },
                },
            },
        ),
    ),
    scope="records:read",
    errors=(503,),
    tag="records",
)
TASKS = Operation(
    "GET",
    "/v1/review/tasks",
    "Review tasks of every review replica (the answering worker asks its peers), filtered, oldest "
    "first (by created_ms, then record id), a page at a time when limit is given.",
    (
        Reply(
            200,
            "A page of tasks: total matches the filters, remaining counts this page's tasks and "
            "those after it (the page starts at task total - remaining + 1); next is the after of "
            "the following page, null on the last.",
            {
                "type": "object",
                "required": ["tasks", "count"],
                "properties": {
                    "tasks": {"type": "array", "items": ReviewTask},
                    "count": INTEGER,
                    "total": INTEGER,
                    "remaining": INTEGER,
                    "next": {"type": ["string", "null"], "pattern": CURSOR_PATTERN},
                },
            },
        ),
    ),
    scope="review:decide",
    params=(
        Param("status", {"type": "string", "maxLength": 128}, "Only tasks in this status (need_human)."),
        Param("applicant_id", {"type": "string", "maxLength": 128}, "Only this applicant's tasks."),
        Param("final_level", {"enum": ["P", "G", "O"]}, "Only tasks of this AI level."),
        Param("created_before_ms", EPOCH_MS, "Only tasks created before this time (epoch ms): an age."),
        Param(
            "after", {"type": "string", "pattern": CURSOR_PATTERN}, "The next cursor of the previous page."
        ),
        Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}, "At most this many (all)."),
    ),
    tag="review",
)
DECIDE = Operation(
    "POST",
    "/v1/review/tasks/{avcc_record_id}/decision",
    "A reviewer approves or rejects a need_human task.",
    (Reply(202, "The decision was accepted.", _DECISION_ACCEPTED),),
    scope="review:decide",
    params=(_RECORD_ID,),
    body=Body(HumanDecisionRequest),
    errors=(404, 409),
    tag="review",
)
SUBMIT_INSTRUCTION = Operation(
    "POST",
    "/v1/settlement/instructions",
    "Submit a settlement instruction for notarisation on the settlement chain.",
    (
        Reply(
            202,
            "Submitted.",
            {
                "type": "object",
                "required": ["instruction_id", "status", "event_id"],
                "properties": {
                    "instruction_id": STRING,
                    "status": {"const": "submitted"},
                    "event_id": STRING,
                },
            },
        ),
    ),
    scope="settlement",
    body=Body(InstructionRequest),
    tag="settlement",
)
INSTRUCTION = Operation(
    "GET",
    "/v1/settlement/instructions/{instruction_id}",
    "Clearing status of an instruction.",
    (Reply(200, "The clearing status.", Clearing),),
    scope="settlement",
    params=(
        Param(
            "instruction_id",
            {"type": "string", "minLength": 1, "maxLength": 128, "pattern": IDENTIFIER_PATTERN},
            "The instruction's id.",
            where="path",
        ),
    ),
    errors=(404,),
    tag="settlement",
)

#: The lifecycle's operations, in the order of the partner document's tags.
OPERATIONS: Final = (
    APPLY,
    APPLY_BATCH,
    RECORD,
    RECORD_COUNTS,
    TIME_TO_CODE,
    TASKS,
    DECIDE,
    SUBMIT_INSTRUCTION,
    INSTRUCTION,
)
