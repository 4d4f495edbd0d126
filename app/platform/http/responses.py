"""JSON answers of every view: responses, the one error body shape, and the one refusal type.

One spelling for the whole HTTP API: a JSON body is orjson; an error is
``{"error": message, "reason": reason, **extra}`` (:func:`json_error`: ``reason`` is required, a
short word a client can branch on), and a 429/503 carries ``Retry-After`` and ``retry_after_s``.
A route refuses a request by raising :class:`RequestRefused` (or a subclass: :class:`BadRequest`,
the authentication refusals of :mod:`app.platform.http.auth`, the batch body's
:class:`~app.platform.http.batch_body.BatchError`), whose :meth:`~RequestRefused.response` is that
answer. Counting answers in ``avcc_http_requests_total`` is not done here but once, by the
:func:`app.platform.http.counting.count_requests` middleware of every worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from app.platform.errors import AvccError
from schemas.violations import to_schema_violation

__all__ = ["BadRequest", "RequestRefused", "json_error", "json_response", "parse_body", "validate_object"]

_M = TypeVar("_M", bound=BaseModel)


class RequestRefused(AvccError):
    """A request refused before the route did anything; :meth:`response` is the answer.

    ``status`` and ``reason`` default to the class's; ``retry_after_s`` adds ``Retry-After``;
    ``extra`` are more fields of the JSON body (``fields``, ``limit_bytes``, ``required``...).
    """

    status: int = 400
    reason: str = "refused"
    retry_after_s: float | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str | None = None,
        retry_after_s: float | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        if reason is not None:
            self.reason = reason
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s
        self.extra: dict[str, Any] = extra

    def response(self) -> web.Response:
        """The JSON answer ``{"error": message, "reason": reason, **extra}``."""
        return json_error(
            self.status, str(self), reason=self.reason, retry_after_s=self.retry_after_s, **self.extra
        )


class BadRequest(RequestRefused):
    """The request body or a parameter is unusable (400); ``fields`` names the offending fields.

    ``reason``: ``malformed_json``, ``not_an_object``, ``schema`` (the body breaks the route's
    model) or ``bad_parameter``. Fix the request as the message says and send it again.
    """

    def __init__(self, message: str, fields: tuple[str, ...] = (), *, reason: str = "schema") -> None:
        super().__init__(message, status=400, reason=reason, fields=list(fields))
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
    reason: str,
    retry_after_s: float | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    """An error answer ``{"error": error, "reason": reason, **extra}`` (400/401/413/429/...).

    ``retry_after_s`` sets ``Retry-After`` (whole seconds, at least 1) and ``retry_after_s`` in the
    body; use it for 429 and 503.
    """
    body: dict[str, Any] = {"error": error, "reason": reason}
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
        raise BadRequest(f"body: malformed JSON ({exc})", ("body",), reason="malformed_json") from exc
    return validate_object(model, data)


def validate_object(model: type[_M], data: Any) -> _M:
    """Validate one decoded JSON value against ``model``; :class:`BadRequest` names the fields
    (the same answer for a single body and for each item of a batch)."""
    if not isinstance(data, dict):
        raise BadRequest("body: must be a JSON object", ("body",), reason="not_an_object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        violation = to_schema_violation(exc)
        raise BadRequest(str(violation), violation.fields) from exc
