"""The console's ``/docs`` page: every operation, parameter, answer and schema of the partner API."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from app.api import OPERATIONS, partner_document
from app.ops.api_docs import render_api_docs, schema_summary


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: set[str] = set()
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        if tag == "a" and str(values.get("href", "")).startswith("#"):
            self.links.add(str(values["href"])[1:])
        if tag in {"script", "link", "img", "iframe"}:
            self.scripts += 1


def test_the_page_shows_every_operation_with_its_scope_parameters_and_answers() -> None:
    document = partner_document()
    page = render_api_docs(document)
    for op in OPERATIONS:
        assert f"<code>{op.path}</code>" in page
        assert f"scope <code>{op.scope}</code>" in page
        for param in op.params:
            assert f"<code>{param.name}</code>" in page
    for status in ("202", "401", "403", "409", "413", "429", "503"):
        assert f"<td><code>{status}</code></td>" in page
    for header in ("X-AVCC-Key", "X-AVCC-Timestamp", "X-AVCC-Nonce", "X-AVCC-Signature"):
        assert f"<code>{header}</code>" in page


def test_every_schema_link_has_its_table_and_nothing_is_loaded_from_elsewhere() -> None:
    collector = _Collector()
    collector.feed(render_api_docs(partner_document()))
    assert collector.links and collector.links <= collector.ids
    assert {f"schema-{name}" for name in partner_document()["components"]["schemas"]} <= collector.ids
    assert collector.scripts == 0


def test_schema_summaries_name_types_references_and_constraints() -> None:
    assert schema_summary({"$ref": "#/components/schemas/Error"}) == '<a href="#schema-Error">Error</a>'
    assert schema_summary({"type": "array", "items": {"type": "integer"}}) == "array of integer"
    text = schema_summary({"type": "string", "maxLength": 200, "pattern": "^<x>$"})
    assert "maxLength 200" in text and "&lt;x&gt;" in text and "<x>" not in text
    assert re.fullmatch(r"string \| null", schema_summary({"anyOf": [{"type": "string"}, {"type": "null"}]}))
