"""Every ``/v1/`` route of the HTTP API: each domain declares its own (:mod:`app.lifecycle.api`,
:mod:`app.playback.api`, :class:`~app.platform.http.openapi.Operation`), merged here.

The agents mount their views with these declarations (``route(app, APPLY)``), each worker serves
the document of its own routes at ``/openapi.json``, and ``schemas/openapi.yaml`` merges them all
for partners (:func:`partner_document`). Bodies and answers are the pydantic models the handlers
validate with and answer from.
"""

from __future__ import annotations

from typing import Any, Final

from app.lifecycle import api as lifecycle
from app.lifecycle.api import (
    APPLY,
    APPLY_BATCH,
    DECIDE,
    INSTRUCTION,
    RECORD,
    RECORD_COUNTS,
    SUBMIT_INSTRUCTION,
    TASKS,
    TIME_TO_CODE,
)
from app.platform.http.openapi import API_VERSION, build_document
from app.playback import api as playback
from app.playback.api import ANOMALIES, PLAYBACK_EVENTS, STATS

__all__ = [
    "ANOMALIES",
    "API_VERSION",
    "APPLY",
    "APPLY_BATCH",
    "DECIDE",
    "INSTRUCTION",
    "OPERATIONS",
    "PLAYBACK_EVENTS",
    "RECORD",
    "RECORD_COUNTS",
    "STATS",
    "SUBMIT_INSTRUCTION",
    "TASKS",
    "TIME_TO_CODE",
    "partner_document",
]

#: Every partner operation, in the order of the partner document's tags.
OPERATIONS: Final = (*lifecycle.OPERATIONS, *playback.OPERATIONS)


def partner_document() -> dict[str, Any]:
    """The merged OpenAPI 3.1 document of every ``/v1/`` route (``schemas/openapi.yaml``)."""
    return build_document(OPERATIONS, title="AVCC partner API", version=API_VERSION)
