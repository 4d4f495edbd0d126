"""The ``/v1/`` routes of playback (the gateway's ingest, the sink's reports), declared once
(:class:`~app.platform.http.openapi.Operation`); :mod:`app.api` merges every domain's routes for
partners."""

from __future__ import annotations

from typing import Final

from app.platform.http.openapi import EPOCH_MS, INTEGER, STRING, Body, Operation, Param, Reply
from schemas.playback import PlaybackEvent

__all__ = ["ANOMALIES", "OPERATIONS", "PLAYBACK_EVENTS", "STATS"]

_TEXT_PARAM = {"type": "string", "maxLength": 200}
_RANGE = (
    Param("from_ms", EPOCH_MS, "Start of the range, epoch ms (inclusive; default 0)."),
    Param("to_ms", EPOCH_MS, "End of the range, epoch ms (exclusive; default: no end)."),
)
PLAYBACK_EVENTS = Operation(
    "POST",
    "/v1/playback/events",
    "A batch of playback reports (a JSON array; NDJSON as application/x-ndjson is also accepted).",
    (
        Reply(
            202,
            "Valid items were produced; invalid ones are listed by index.",
            {
                "type": "object",
                "required": ["accepted", "rejected", "errors"],
                "properties": {
                    "accepted": INTEGER,
                    "rejected": INTEGER,
                    "errors": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["index", "error"],
                            "properties": {"index": INTEGER, "error": STRING},
                        },
                    },
                },
            },
        ),
    ),
    scope="playback:write",
    body=Body(PlaybackEvent, array=True),
    errors=(415, 429),
    tag="playback",
)
STATS = Operation(
    "GET",
    "/v1/playback/stats",
    "Exact play/complete/purchase counts, revenue and unique users of a code (or all).",
    (
        Reply(
            200,
            "The totals.",
            {
                "type": "object",
                "required": ["plays", "completes", "purchases", "revenue_cny", "unique_users", "events"],
                "properties": {
                    "avcc_code": {"type": ["string", "null"]},
                    "from_ms": INTEGER,
                    "to_ms": INTEGER,
                    "plays": INTEGER,
                    "completes": INTEGER,
                    "purchases": INTEGER,
                    "revenue_cny": {"type": "string", "pattern": "^-?[0-9]+\\.[0-9]{2}$"},
                    "unique_users": INTEGER,
                    "events": INTEGER,
                },
            },
        ),
    ),
    scope="playback:read",
    params=(Param("avcc_code", _TEXT_PARAM, "Only this code."), *_RANGE),
    tag="playback",
)
ANOMALIES = Operation(
    "GET",
    "/v1/playback/anomalies",
    "Distinct playback anomalies, newest window first.",
    (
        Reply(
            200,
            "The anomalies.",
            {
                "type": "object",
                "required": ["anomalies"],
                "properties": {"anomalies": {"type": "array", "items": {"type": "object"}}},
            },
        ),
    ),
    scope="playback:read",
    params=(
        Param("avcc_code", _TEXT_PARAM, "Only this code."),
        Param("rule", _TEXT_PARAM, "Only this rule."),
        *_RANGE,
        Param("limit", {"type": "integer", "minimum": 1, "maximum": 10_000}, "At most this many (100)."),
    ),
    tag="playback",
)

#: Playback's operations, in the order of the partner document's tags.
OPERATIONS: Final = (PLAYBACK_EVENTS, STATS, ANOMALIES)
