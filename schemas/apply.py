"""Payload of ``topic.avcc.apply.created``: an application passed pre-check (seed 9.2.1)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from schemas.types import (
    ContentUrl,
    ContractModel,
    Identifier,
    MediaType,
    NonBlankStr,
    RecordId,
    Sha256Ref,
    WholeNumber,
)

__all__ = ["AiToolInfo", "ApplyCreated"]


class AiToolInfo(ContractModel):
    """The generative tool that made the work."""

    model_name: NonBlankStr
    model_version: Annotated[NonBlankStr, StringConstraints(max_length=64)]


class ApplyCreated(ContractModel):
    """A coding application passed pre-check (code-svc -> review-svc)."""

    request_id: Identifier
    avcc_record_id: RecordId
    #: Where the work is stored: s3://, oss://, http(s):// or ipfs://.
    content_url: ContentUrl
    content_hash: Sha256Ref
    ai_tool_info: AiToolInfo
    #: 0 (lowest) .. 9 (highest).
    priority: Annotated[int, Field(ge=0, le=9), WholeNumber]
    title: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = None
    applicant_id: Identifier | None = None
    media_type: MediaType | None = None
