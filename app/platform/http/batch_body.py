"""A batch body: a JSON array (``application/json``) or NDJSON (``application/x-ndjson``, one object
per non-empty line), read into its items with a cap on their number.

The gateway's playback batches and the code group's bulk applications read their bodies here;
each route validates the items against its own model. Items are reported by index (the position
in the array, or among the non-empty lines of an NDJSON body).
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson

from app.platform.http.responses import RequestRefused

__all__ = ["NDJSON", "VALUES_PER_ITEM", "BatchError", "TooManyItems", "parse_items"]

NDJSON: Final = "application/x-ndjson"
#: Commas one valid item brings to an array body (6 between its 7 fields, 1 after it).
VALUES_PER_ITEM: Final = 7


class BatchError(RequestRefused):
    """The body cannot be read as a batch (400/413/415); ``status`` and ``reason`` say why."""

    def __init__(self, status: int, reason: str, message: str, **extra: Any) -> None:
        super().__init__(message, status=status, reason=reason, **extra)


class TooManyItems(BatchError):
    """More items than ``AVCC_GATEWAY_MAX_ITEMS`` (413): split the batch."""

    def __init__(self, count: int | None, limit: int) -> None:
        counted = f"{count} items" if count is not None else f"more than {limit} items"
        super().__init__(
            413, "too_many_items", f"batch has {counted}; the limit is {limit}", limit_items=limit
        )


def parse_items(
    body: bytes, content_type: str, max_items: int = 1_000_000
) -> tuple[list[Any], dict[int, str]]:
    """The batch items and the per-index errors of NDJSON lines that are not JSON.

    The item cap is enforced while reading, before the items past it are parsed, so a body of
    millions of tiny or broken items costs no more than ``max_items`` of them. Raises
    :class:`BatchError` for an unsupported content type, a body that is not a JSON array (JSON),
    an empty batch and :class:`TooManyItems`.
    """
    if content_type == NDJSON:
        items, errors = _ndjson_items(body, max_items)
    elif content_type in {"application/json", ""}:
        items, errors = _array_items(body, max_items), {}
    else:
        raise BatchError(415, "unsupported_media_type", f"Content-Type must be application/json or {NDJSON}")
    if not items:
        raise BatchError(400, "empty_batch", "body: the batch has no items")
    return items, errors


def _ndjson_items(body: bytes, max_items: int) -> tuple[list[Any], dict[int, str]]:
    lines = [line for line in body.split(b"\n") if line.strip()]
    if len(lines) > max_items:
        raise TooManyItems(len(lines), max_items)
    items: list[Any] = []
    errors: dict[int, str] = {}
    for index, line in enumerate(lines):
        try:
            items.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            errors[index] = f"<root>: malformed JSON ({' '.join(str(exc).split())})"
            items.append(None)
    return items, errors


def _malformed(detail: object) -> BatchError:
    return BatchError(400, "malformed_json", f"body: malformed JSON ({detail})")


def _array_items(body: bytes, max_items: int) -> list[Any]:
    """The items of a JSON array body, at most ``max_items`` of them parsed.

    The commas of a body bound the JSON values in it (each value but the first follows a
    comma), so a body with fewer than :data:`VALUES_PER_ITEM` commas per allowed item - every
    batch of valid items within the cap - is parsed at once by orjson, whatever it holds, at a
    bounded cost. Otherwise the array is decoded one item at a time and refused as soon as the
    cap is passed.
    """
    if body.count(b",") < max_items * VALUES_PER_ITEM:
        try:
            decoded = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise _malformed(exc) from exc
        if not isinstance(decoded, list):
            raise BatchError(400, "not_an_array", "body: must be a JSON array of playback events")
        if len(decoded) > max_items:
            raise TooManyItems(len(decoded), max_items)
        return decoded
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        raise _malformed(exc) from exc
    decoder = json.JSONDecoder(parse_constant=_refuse_constant)
    position = _skip_space(text, 0)
    if not text.startswith("[", position):
        raise BatchError(400, "not_an_array", "body: must be a JSON array of playback events")
    position = _skip_space(text, position + 1)
    items: list[Any] = []
    try:
        while not text.startswith("]", position):
            if items:
                if not text.startswith(",", position):
                    raise _malformed(f"expected ',' or ']' at character {position}")
                position = _skip_space(text, position + 1)
            item, position = decoder.raw_decode(text, position)
            items.append(item)
            if len(items) > max_items:
                raise TooManyItems(None, max_items)
            position = _skip_space(text, position)
    except json.JSONDecodeError as exc:
        raise _malformed(exc) from exc
    if _skip_space(text, position + 1) != len(text):
        raise _malformed(f"data after the array at character {position + 1}")
    return items


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _refuse_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)
