"""The one JSON codec of the pipeline (orjson), also registered as faust codec ``"orjson"``."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any, Final

import faust.serializers.codecs as faust_codecs
import orjson
from pydantic import BaseModel

from schemas.errors import UndecodableMessage

__all__ = ["CODEC_NAME", "OrjsonCodec", "dumps", "loads", "register_codec"]

#: Name under which :func:`register_codec` registers the faust codec.
CODEC_NAME: Final = "orjson"


def _default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, Decimal):
        return str(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON of ``obj``; pydantic models in their JSON form, ``Decimal`` as a string.

    Raises ``TypeError`` for values JSON cannot carry.
    """
    return orjson.dumps(obj, default=_default)


def loads(data: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """The JSON object in ``data``.

    Raises ``UndecodableMessage`` when ``data`` is not UTF-8 JSON or its top level is not an
    object. Integers beyond 64 bits decode as floats (orjson).
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        reason = " ".join(str(exc).split())
        raise UndecodableMessage(f"message is not valid UTF-8 JSON: {reason}") from exc
    except TypeError as exc:
        raise UndecodableMessage(f"message is not bytes: {type(data).__name__}") from exc
    if not isinstance(value, dict):
        raise UndecodableMessage(f"message is JSON but not an object (top level is {_json_kind(value)})")
    return value


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


class OrjsonCodec(faust_codecs.Codec):
    """faust codec backed by :func:`dumps` / :func:`loads` (values must be JSON objects)."""

    def _dumps(self, s: Any) -> bytes:
        return dumps(s)

    def _loads(self, s: bytes) -> Any:
        return loads(s)


_register_lock = threading.Lock()


def register_codec() -> None:
    """Register :class:`OrjsonCodec` with faust as ``"orjson"`` (idempotent, thread-safe)."""
    with _register_lock:
        if not isinstance(faust_codecs.codecs.get(CODEC_NAME), OrjsonCodec):
            faust_codecs.register(CODEC_NAME, OrjsonCodec())
