"""Body of ``POST /v1/avcc/applications``: what an applicant submits before pre-check."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from schemas.apply import AiToolInfo
from schemas.types import ContentUrl, ContractModel, Identifier, MediaType, Sha256Ref, WholeNumber

__all__ = ["ApplicationRequest"]


class ApplicationRequest(ContractModel):
    """An application for an AVCC code. ``request_id`` makes retries idempotent."""

    request_id: Identifier
    content_url: ContentUrl
    content_hash: Sha256Ref
    ai_tool_info: AiToolInfo
    #: 0 (lowest) .. 9 (highest).
    priority: Annotated[int, Field(ge=0, le=9), WholeNumber] = 5
    title: Annotated[str, StringConstraints(min_length=1, max_length=512)]
    applicant_id: Identifier
    media_type: MediaType | None = None
