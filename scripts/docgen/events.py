"""The event contracts reference: the AsyncAPI document (``schemas/asyncapi.yaml``) as Markdown,
one section per topic, then the named schemas (envelope, failure headers, payloads)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from scripts.docgen.blocks import ROOT
from scripts.docgen.schema_md import SchemaRenderer, cell, docstring_text

__all__ = ["events"]

ASYNCAPI = ROOT / "schemas" / "asyncapi.yaml"
JSON_SCHEMAS = ROOT / "schemas" / "json"


def _resolve(document: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    node: Any = document
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return dict(node)


def _groups(document: Mapping[str, Any], channel: str) -> tuple[list[str], list[str]]:
    sends: list[str] = []
    receives: list[str] = []
    for op in document.get("operations", {}).values():
        if op["channel"]["$ref"] == f"#/channels/{channel}":
            (sends if op["action"] == "send" else receives).append(cell(op.get("title", "")))
    return sends, receives


def _channel(
    document: Mapping[str, Any], renderer: SchemaRenderer, key: str, channel: Mapping[str, Any]
) -> str:
    topic = channel["address"]
    binding = channel.get("bindings", {}).get("kafka", {})
    parts = [f"### `{topic}`", docstring_text(channel.get("description", ""))]
    facts = [
        f"partitions {binding.get('partitions', '?')}",
        f"key `{channel.get('x-avcc-key', '?')}`",
        f"producer profile {channel.get('x-avcc-producer-profile', '?')}",
    ]
    parts.append(" · ".join(facts))
    for message in channel.get("messages", {}).values():
        body = _resolve(document, message["$ref"])
        title = body.get("title", body.get("name", "message"))
        line = f"**{title}**: {docstring_text(body.get('summary', ''))}"
        payload = body.get("payload", {})
        if "$ref" in payload:
            line += f" Payload: {renderer.type_of(payload)}."
        if "headers" in body:
            line += f" Headers: {renderer.type_of(body['headers'])}."
        parts.append(line)
    if (JSON_SCHEMAS / f"{topic}.json").is_file():
        parts.append(f"JSON Schema of the payload: `schemas/json/{topic}.json`.")
    sends, receives = _groups(document, key)
    parts.append("\n".join(f"- {line}" for line in (*sends, *receives)))
    return "\n\n".join(p for p in parts if p)


def events() -> str:
    """Every topic of the document (layout, key, message, who sends and receives it), then every
    named schema with its fields."""
    document = yaml.safe_load(ASYNCAPI.read_text())
    renderer = SchemaRenderer(document.get("components", {}).get("schemas", {}), "event")
    parts = ["## Topics"]
    parts += [_channel(document, renderer, k, c) for k, c in document.get("channels", {}).items()]
    parts.append("## Schemas")
    parts += [renderer.section(name) for name in renderer.schemas]
    return "\n\n".join(parts)
