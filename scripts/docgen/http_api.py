"""The HTTP API reference: the partner OpenAPI document (``schemas/openapi.yaml``) as Markdown,
each route under the agent group whose workers serve it (each worker's own document says which)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from app.platform.groups import GROUPS
from app.platform.http.openapi import worker_document
from app.platform.internal_topics import group_app
from app.platform.settings import Settings
from scripts.docgen.blocks import ROOT
from scripts.docgen.schema_md import SchemaRenderer, cell, docstring_text

__all__ = ["http_api"]

OPENAPI = ROOT / "schemas" / "openapi.yaml"
_METHODS = ("get", "post", "put", "patch", "delete")


def _operations(document: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    return [
        (method, path, item[method])
        for path, item in document.get("paths", {}).items()
        for method in _METHODS
        if method in item
    ]


def _body_type(renderer: SchemaRenderer, content: Mapping[str, Any] | None) -> str:
    if not content:
        return "—"
    kinds = []
    for media, value in content.items():
        schema = value.get("schema")
        kinds.append(f"{media}: {renderer.type_of(schema) if schema else 'text'}")
    return cell("; ".join(kinds))


def _inline_object(content: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    for value in (content or {}).values():
        schema = value.get("schema", {})
        if schema.get("type") == "object" and schema.get("properties"):
            return dict(schema)
    return None


def _operation(renderer: SchemaRenderer, method: str, path: str, op: Mapping[str, Any]) -> str:
    parts = [f"### `{method.upper()} {path}`", docstring_text(op.get("summary", ""))]
    scope = op.get("x-avcc-scope")
    parts.append(f"Signed; scope `{scope}`." if scope else "No signature needed.")
    params = op.get("parameters", [])
    if params:
        rows = ["| parameter | in | type | required | meaning |", "|---|---|---|---|---|"]
        for p in params:
            rows.append(
                f"| `{p['name']}` | {p['in']} | {renderer.type_of(p.get('schema', {}))} "
                f"| {'yes' if p.get('required') else 'no'} | {cell(p.get('description', ''))} |"
            )
        parts.append("\n".join(rows))
    body = op.get("requestBody")
    if body:
        parts.append(f"**Body**: {_body_type(renderer, body.get('content'))}")
    rows = ["| status | meaning | body |", "|---|---|---|"]
    inline: list[str] = []
    for status, answer in op.get("responses", {}).items():
        content = answer.get("content")
        rows.append(f"| {status} | {cell(answer.get('description', ''))} | {_body_type(renderer, content)} |")
        shape = _inline_object(content)
        if shape is not None:
            inline.append(f"The `{status}` body:\n\n{renderer.fields(shape)}")
    parts.append("\n".join(rows))
    parts += inline
    return "\n\n".join(p for p in parts if p)


def http_api() -> str:
    """Every route grouped by the agent group serving it, the probes every worker serves, the
    security headers and the named schemas."""
    document = yaml.safe_load(OPENAPI.read_text())
    components = document.get("components", {})
    renderer = SchemaRenderer(components.get("schemas", {}), "schema")
    partner = {(m, p): op for m, p, op in _operations(document)}
    base_port = Settings.model_fields["web_port"].default
    parts: list[str] = []
    probes: list[tuple[str, str, Mapping[str, Any]]] = []
    for group in GROUPS:
        served = _operations(worker_document(group_app(group), group.name))
        mine = [(m, p, partner[m, p]) for m, p, _ in served if (m, p) in partner]
        probes = probes or [(m, p, op) for m, p, op in served if (m, p) not in partner]
        if mine:
            parts.append(f"## {group.name} group (port {base_port + group.port_offset})")
            parts += [_operation(renderer, m, p, op) for m, p, op in mine]
    parts.append("## Every worker")
    parts += [_operation(renderer, m, p, op) for m, p, op in probes]
    rows = ["| header | meaning |", "|---|---|"]
    for scheme in components.get("securitySchemes", {}).values():
        rows.append(f"| `{scheme['name']}` | {cell(scheme.get('description', ''))} |")
    parts += ["## Signature headers", "\n".join(rows), "## Schemas"]
    parts += [renderer.section(name) for name in renderer.schemas]
    return "\n\n".join(parts)
