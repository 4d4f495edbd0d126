"""Turns a pydantic ``ValidationError`` into one single-line ``SchemaViolation`` naming the fields."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from schemas.errors import SchemaViolation
from schemas.types import PATTERN_REASONS

__all__ = ["MAX_LISTED_ERRORS", "field_path", "to_schema_violation"]

#: At most this many field errors are spelled out in the message (``fields`` lists them all).
MAX_LISTED_ERRORS: Final = 20
_MAX_SEGMENT: Final = 64

_JSON_TYPE_NAMES: Final[dict[type, str]] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
    type(None): "null",
}


def _segment(part: str | int) -> str:
    text = str(part)
    if not text.isprintable():
        text = repr(text)[1:-1]
    if len(text) > _MAX_SEGMENT:
        text = text[: _MAX_SEGMENT - 3] + "..."
    return text


def field_path(loc: Sequence[str | int], prefix: str = "") -> str:
    """Dotted path of a pydantic error location (list indexes are segments: ``splits.0.party``)."""
    dotted = ".".join(_segment(part) for part in loc)
    if not prefix:
        return dotted or "<root>"
    return f"{prefix}.{dotted}" if dotted else prefix


def _type_name(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _reason(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required field missing"
    if kind == "extra_forbidden":
        return "unexpected field"
    if kind == "string_pattern_mismatch":
        pattern = str(error.get("ctx", {}).get("pattern", ""))
        return PATTERN_REASONS.get(pattern, f"must match {pattern}")
    message = error["msg"]
    if kind.endswith("_type") and "input" in error:
        message = f"{message} (got {_type_name(error['input'])})"
    message = " ".join(message.split())
    if message.startswith("Input should be "):
        return "must be " + message.removeprefix("Input should be ")
    return message[:1].lower() + message[1:]


def to_schema_violation(
    exc: ValidationError,
    *,
    prefix: str = "",
    rename: Callable[[str], str] | None = None,
) -> SchemaViolation:
    """One ``SchemaViolation``: ``"a.b: reason; c: reason"``, ``fields`` = dotted paths in order.

    ``prefix`` is prepended to every path; ``rename`` maps a top-level field name to the name the
    caller knows (e.g. a Kafka header name).
    """
    fields: list[str] = []
    reasons: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        loc = list(error["loc"])
        if rename is not None and loc and isinstance(loc[0], str):
            loc[0] = rename(loc[0])
        path = field_path(loc, prefix)
        reason = _reason(error)
        if path not in reasons:
            fields.append(path)
            reasons[path] = []
        if reason not in reasons[path]:
            reasons[path].append(reason)
    listed = [f"{path}: {', '.join(reasons[path])}" for path in fields[:MAX_LISTED_ERRORS]]
    if len(fields) > MAX_LISTED_ERRORS:
        listed.append(f"... and {len(fields) - MAX_LISTED_ERRORS} more fields")
    return SchemaViolation("; ".join(listed), fields)
