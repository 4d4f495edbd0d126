"""JSON answers of every view: responses, error bodies, and request bodies validated into models.

One spelling for the whole HTTP API: a JSON body is orjson, an error is
``{"error": message, "reason": reason, **extra}`` and a 429/503 carries ``Retry-After``.
Counting answers in ``avcc_http_requests_total`` is not done here but once, by the
:func:`app.platform.http.counting.count_requests` middleware of every worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from schemas.violations import to_schema_violation

__all__ = ["BadRequest", "json_error", "json_response", "parse_body", "validate_object"]

_M = TypeVar("_M", bound=BaseModel)


class BadRequest(Exception):
    """The request body is unusable; ``fields`` names the offending fields."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A JSON (orjson) response; usable as the return value of any faust/aiohttp view."""
    return web.Response(
        body=orjson.dumps(data),
        status=status,
        content_type="application/json",
        headers=dict(headers) if headers else None,
    )


def json_error(
    status: int,
    error: str,
    *,
    reason: str | None = None,
    retry_after_s: float | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    """An error answer ``{"error": error, "reason": reason, **extra}`` (400/401/413/429/...).

    ``reason`` is left out of the body when ``None``. ``retry_after_s`` sets ``Retry-After``
    (whole seconds, at least 1) and ``retry_after_s`` in the body; use it for 429 and 503.
    """
    body: dict[str, Any] = {"error": error}
    if reason is not None:
        body["reason"] = reason
    all_headers = dict(headers) if headers else {}
    if retry_after_s is not None:
        seconds = max(1, int(retry_after_s + 0.999))
        all_headers["Retry-After"] = str(seconds)
        body["retry_after_s"] = seconds
    body.update(extra)
    return json_response(body, status, all_headers)


def parse_body(model: type[_M], raw: bytes) -> _M:
    """Validate a JSON body against ``model``; :class:`BadRequest` names the fields."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body: malformed JSON ({exc})", ("body",)) from exc
    return validate_object(model, data)


def validate_object(model: type[_M], data: Any) -> _M:
    """Validate one decoded JSON value against ``model``; :class:`BadRequest` names the fields
    (the same answer for a single body and for each item of a batch)."""
    if not isinstance(data, dict):
        raise BadRequest("body: must be a JSON object", ("body",))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        violation = to_schema_violation(exc)
        raise BadRequest(str(violation), violation.fields) from exc
