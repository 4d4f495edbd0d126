"""A small block-style YAML emitter for the generated artefacts (k8s manifests, AsyncAPI).

Written here rather than with PyYAML so the output is stable and the runtime needs no YAML
library: plain scalars only where YAML cannot misread them, JSON-quoted strings otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["to_yaml"]

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _RESERVED:
        return text
    return json.dumps(text, ensure_ascii=False)


def _inline(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    return _scalar(value)


def _emit(obj: Any, indent: int) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if isinstance(value, Mapping | list | tuple) and value:
                lines.append(f"{pad}{_scalar(key)}:")
                lines.extend(_emit(value, indent + 1))
            else:
                lines.append(f"{pad}{_scalar(key)}: {_inline(value)}")
        return lines
    for item in obj:
        if isinstance(item, Mapping | list | tuple) and item:
            sub = _emit(item, indent + 1)
            lines.append(f"{pad}- {sub[0][len(pad) + 2 :]}")
            lines.extend(sub[1:])
        else:
            lines.append(f"{pad}- {_inline(item)}")
    return lines


def to_yaml(*documents: Any) -> str:
    """Block-style YAML of ``documents`` (dicts, lists, str, int, float, bool, None), ``---`` separated."""
    return "---\n".join("\n".join(_emit(doc, 0)) + "\n" for doc in documents)
