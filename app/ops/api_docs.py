"""``GET /docs`` on the console port: the partner API document (``schemas/openapi.yaml``) as HTML.

Server-side tables of every operation (scope, parameters, body, answers) and of every schema
they use, rendered from the partner document (:func:`app.api.partner_document`: the same
declarations the workers serve as ``/openapi.json``), so the page cannot drift from the API. No
script, no CDN: the console's Content-Security-Policy allows inline styles only. The page stays
behind the operator login like every console page: partners get the document itself.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, Final

import faust

__all__ = ["ROUTE", "install_api_docs", "render_api_docs", "schema_summary"]

ROUTE: Final = "/docs"
_REF_PREFIX: Final = "#/components/schemas/"
_e = html.escape
_CSS: Final = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:72rem;
padding:1rem 1.5rem;color:#1d2330}
table{border-collapse:collapse;width:100%;margin:.4rem 0 1rem}
th,td{border:1px solid #d5d9e0;padding:.3rem .5rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#eef0f4}code{font-size:.85rem}.method{font-weight:700;text-transform:uppercase}
section{border-top:2px solid #1d2330;margin-top:1.5rem}.muted{color:#5b6475}
"""
_CONSTRAINTS: Final = (
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "default",
)


def _anchor(name: str) -> str:
    return "schema-" + "".join(c if c.isalnum() else "-" for c in name)


def schema_summary(schema: Mapping[str, Any]) -> str:
    """A short HTML description of a JSON schema: its type, references linked, its constraints."""
    if "$ref" in schema:
        name = str(schema["$ref"]).removeprefix(_REF_PREFIX)
        return f'<a href="#{_anchor(name)}">{_e(name)}</a>'
    for combiner in ("anyOf", "oneOf", "allOf"):
        if combiner in schema:
            joiner = " and " if combiner == "allOf" else " | "
            return joiner.join(schema_summary(part) for part in schema[combiner])
    if "const" in schema:
        return f"<code>{_e(repr(schema['const']))}</code>"
    if "enum" in schema:
        return "one of " + ", ".join(f"<code>{_e(str(v))}</code>" for v in schema["enum"])
    kind = schema.get("type", "any")
    text = " | ".join(kind) if isinstance(kind, list) else str(kind)
    if text == "array" and isinstance(schema.get("items"), Mapping):
        text = f"array of {schema_summary(schema['items'])}"
    else:
        text = _e(text)
    limits = [f"{key} {schema[key]!r}" for key in _CONSTRAINTS if key in schema]
    if limits:
        text += f' <span class="muted">({_e(", ".join(limits))})</span>'
    return text


def _table(headings: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in headings)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _content(content: Mapping[str, Any]) -> str:
    lines = [f"<code>{_e(kind)}</code>: {schema_summary(m.get('schema', {}))}" for kind, m in content.items()]
    return "<br>".join(lines)


def _operation(path: str, method: str, op: Mapping[str, Any]) -> str:
    scope = op.get("x-avcc-scope")
    parts = [
        f'<h3 id="{_e(op["operationId"])}"><span class="method">{_e(method)}</span> ',
        f"<code>{_e(path)}</code></h3>",
        f"<p>{_e(op.get('summary', ''))}</p>",
        f"<p>Signed (HMAC), scope <code>{_e(scope)}</code>.</p>" if scope else "<p>Open, no signature.</p>",
    ]
    params = op.get("parameters", [])
    if params:
        rows = [
            (
                f"<code>{_e(p['name'])}</code>",
                _e(p["in"]),
                "yes" if p.get("required") else "no",
                schema_summary(p.get("schema", {})),
                _e(p.get("description", "")),
            )
            for p in params
        ]
        parts.append("<h4>Parameters</h4>" + _table(("name", "in", "required", "schema", "meaning"), rows))
    body = op.get("requestBody")
    if body:
        parts.append(f"<h4>Request body</h4><p>{_content(body['content'])}</p>")
    answers = [
        (f"<code>{_e(status)}</code>", _e(answer.get("description", "")), _content(answer.get("content", {})))
        for status, answer in op["responses"].items()
    ]
    parts.append("<h4>Answers</h4>" + _table(("status", "meaning", "body"), answers))
    return "".join(parts)


def _schema_section(name: str, schema: Mapping[str, Any]) -> str:
    title = f'<h3 id="{_anchor(name)}">{_e(name)}</h3>'
    described = f"<p>{_e(schema['description'])}</p>" if "description" in schema else ""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return f"{title}{described}<p>{schema_summary(schema)}</p>"
    required = set(schema.get("required", ()))
    rows = [
        (
            f"<code>{_e(field)}</code>",
            "yes" if field in required else "no",
            schema_summary(spec),
            _e(str(spec.get("description", ""))),
        )
        for field, spec in properties.items()
    ]
    extra = "" if schema.get("additionalProperties", True) else "<p class='muted'>No other fields.</p>"
    return title + described + _table(("field", "required", "schema", "meaning"), rows) + extra


def render_api_docs(document: Mapping[str, Any]) -> str:
    """The whole HTML page of an OpenAPI 3.1 ``document``."""
    info = document["info"]
    operations = [
        _operation(path, method, op)
        for path, methods in document["paths"].items()
        for method, op in methods.items()
    ]
    components = document.get("components", {})
    headers = [
        (f"<code>{_e(s['name'])}</code>", _e(s.get("description", "")))
        for s in components.get("securitySchemes", {}).values()
    ]
    schemas = [_schema_section(name, schema) for name, schema in components.get("schemas", {}).items()]
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(info['title'])}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(info['title'])} <span class='muted'>{_e(info['version'])}</span></h1>"
        f"<p>{_e(info.get('description', ''))}</p>"
        "<p>Machine-readable: <code>schemas/openapi.yaml</code>; each worker serves its own routes "
        "at <code>/openapi.json</code>.</p>"
        "<h2>Signing headers</h2>"
        + _table(("header", "value"), headers)
        + "<section><h2>Operations</h2>"
        + "".join(operations)
        + "</section><section><h2>Schemas</h2>"
        + "".join(schemas)
        + "</section></body></html>"
    )


def install_api_docs(app: faust.App, document: Mapping[str, Any]) -> None:
    """Serve ``GET /docs`` (operator login, like every console page) on ``app``: ``document``, the
    partner API document, as HTML (the ops group's wiring hands it over, see :mod:`app.api`)."""
    page = render_api_docs(document)

    async def docs(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.html(page)

    app.page(ROUTE, name="avcc_ops_api_docs")(docs)
