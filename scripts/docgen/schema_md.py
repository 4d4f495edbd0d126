"""JSON Schema (as OpenAPI 3.1 and AsyncAPI 3.0 carry it) rendered as Markdown field tables."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["SchemaRenderer", "cell", "docstring_text"]

#: Patterns longer than this are left to the schema document (character classes of Unicode blanks).
_PATTERN_SHOWN = 48


def docstring_text(text: str) -> str:
    """A Python docstring's reST markup as Markdown: ``code`` and :role:`name` become code spans."""
    text = re.sub(r":[a-z:]+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def cell(text: str) -> str:
    """``text`` fit for one Markdown table cell."""
    return docstring_text(" ".join(text.split())).replace("|", "\\|")


class SchemaRenderer:
    """Renders the named schemas of one document; ``$ref``s become links to their sections."""

    def __init__(self, schemas: Mapping[str, Any], anchor_prefix: str) -> None:
        self.schemas = schemas
        self.anchor_prefix = anchor_prefix

    def anchor(self, name: str) -> str:
        """The heading id of schema ``name``."""
        return f"{self.anchor_prefix}-{name.lower()}"

    def resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        """The named schema a ``$ref`` points at, or ``schema`` itself."""
        if "$ref" not in schema:
            return schema
        return dict(self.schemas[schema["$ref"].rsplit("/", 1)[-1]])

    def link(self, ref: str) -> str:
        """A link to the section of the schema a ``$ref`` names."""
        name = ref.rsplit("/", 1)[-1]
        return f"[{name}](#{self.anchor(name)})"

    def type_of(self, schema: Mapping[str, Any]) -> str:
        """What a value of ``schema`` is, in a few words."""
        if "$ref" in schema:
            return self.link(schema["$ref"])
        if "const" in schema:
            return f"`{json.dumps(schema['const'])}`"
        if "enum" in schema:
            return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return " or ".join(self.type_of(s) for s in schema[key])
        if "allOf" in schema:
            return " and ".join(self.type_of(s) for s in schema["allOf"])
        kind = schema.get("type")
        if isinstance(kind, list):
            return " or ".join(str(k) for k in kind)
        if kind == "array":
            return f"array of {self.type_of(schema.get('items', {}))}"
        if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
            return f"object of {self.type_of(schema['additionalProperties'])}"
        if kind == "string" and "format" in schema:
            return f"string ({schema['format']})"
        return str(kind or "any")

    @staticmethod
    def constraints(schema: Mapping[str, Any]) -> list[str]:
        """The bounds a value must keep, as short phrases."""
        found = []
        for key, word in (("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥")):
            if key in schema:
                found.append(f"{word} {schema[key]}")
        if "maxItems" in schema:
            found.append(f"items ≤ {schema['maxItems']}")
        for key, word in (
            ("minimum", "≥"),
            ("exclusiveMinimum", ">"),
            ("maximum", "≤"),
            ("exclusiveMaximum", "<"),
        ):
            if key in schema:
                found.append(f"{word} {schema[key]}")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            shown = pattern.removesuffix("(?!\\n)")
            found.append(f"matches `{shown}`" if len(shown) <= _PATTERN_SHOWN else "pattern in the schema")
        return found

    def fields(self, schema: Mapping[str, Any]) -> str:
        """A table of an object schema's properties: name, type, required, rules and meaning."""
        if "allOf" in schema:
            bases = [self.type_of(part) for part in schema["allOf"] if "$ref" in part]
            parts = [self.resolve(p) for p in schema["allOf"]]
            needed = [name for part in parts for name in part.get("required", ())]
            merged = {k: v for part in schema["allOf"] for k, v in part.get("properties", {}).items()}
            shape = {"properties": merged, "required": needed}
            return f"{' and '.join(bases)}, with:\n\n{self.fields(shape)}"
        properties: Mapping[str, Any] = schema.get("properties", {})
        if not properties:
            return f"A value of type {self.type_of(schema)}."
        required = set(schema.get("required", ()))
        rows = ["| field | type | required | rules | meaning |", "|---|---|---|---|---|"]
        for name, prop in properties.items():
            rules = self.constraints(prop)
            for alternative in prop.get("anyOf", ()):
                rules += self.constraints(alternative)
            if prop.get("default") is not None:
                rules.append(f"default `{json.dumps(prop['default'])}`")
            rows.append(
                f"| `{name}` | {self.type_of(prop)} | {'yes' if name in required else 'no'} "
                f"| {cell('; '.join(rules))} | {cell(prop.get('description', ''))} |"
            )
        return "\n".join(rows)

    def section(self, name: str, level: int = 3) -> str:
        """A heading for schema ``name`` (with its anchor), its description and its fields."""
        schema = self.schemas[name]
        parts = [f"{'#' * level} {name} {{#{self.anchor(name)}}}"]
        if schema.get("description"):
            parts.append(docstring_text(schema["description"]))
        parts.append(self.fields(schema))
        return "\n\n".join(parts)
