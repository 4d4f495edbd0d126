"""The HTTP API document: valid OpenAPI 3.1, fresh, and covering every route the agents mount."""

from __future__ import annotations

import re

import faust
import yaml
from openapi_spec_validator import validate

from app.api import OPERATIONS, partner_document
from app.contract_docs.generate import OPENAPI_FILE, ROOT, stale_files
from app.platform.credentials import ALL_SCOPES
from app.platform.http.openapi import install_openapi, route, worker_document
from app.platform.http.operators import is_open_route


def test_the_partner_document_is_valid_openapi_3_1() -> None:
    document = yaml.safe_load((ROOT / OPENAPI_FILE).read_text())
    validate(document)
    assert document["openapi"].startswith("3.1")


def test_the_committed_partner_document_is_fresh() -> None:
    assert OPENAPI_FILE not in stale_files(), "run: python -m app.contract_docs"


def test_every_partner_operation_is_signed_with_a_scope_and_every_scope_is_used() -> None:
    document = partner_document()
    scopes = set()
    for path, methods in document["paths"].items():
        assert path.startswith("/v1/")
        for operation in methods.values():
            assert {"401", "403", "503"} <= set(operation["responses"])
            assert operation["security"] and operation["x-avcc-scope"] in ALL_SCOPES
            scopes.add(operation["x-avcc-scope"])
    assert scopes == ALL_SCOPES


def test_every_error_answer_has_the_shared_error_shape() -> None:
    document = partner_document()
    for methods in document["paths"].values():
        for operation in methods.values():
            for status, answer in operation["responses"].items():
                if int(status) >= 400:
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, status


def test_each_operation_is_mounted_by_exactly_one_agent_and_no_v1_route_bypasses_the_registry() -> None:
    sources = {p.name: p.read_text() for p in (ROOT / "agents").glob("*.py")}
    for source in sources.values():
        assert not re.search(r"app\.page\(\s*[\"'/]*v1", source)
    names = {
        "APPLY",
        "APPLY_BATCH",
        "RECORD",
        "RECORD_COUNTS",
        "TIME_TO_CODE",
        "TASKS",
        "DECIDE",
        "SUBMIT_INSTRUCTION",
        "INSTRUCTION",
        "PLAYBACK_EVENTS",
        "STATS",
        "ANOMALIES",
    }
    assert len(names) == len(OPERATIONS)
    for name in names:
        users = [file for file, text in sources.items() if re.search(rf"@route\(app, {name}\)", text)]
        assert len(users) == 1, (name, users)


def test_a_worker_documents_its_own_routes_and_the_probes_and_serves_the_document_openly() -> None:
    app = faust.App("openapi-unit-test", autodiscover=False)
    stats, anomalies = OPERATIONS[-2], OPERATIONS[-1]
    route(app, stats)(type("Stats", (faust.web.View,), {}))
    route(app, anomalies)(type("Anomalies", (faust.web.View,), {}))
    install_openapi(app, "sink")
    document = worker_document(app, "sink")
    validate(document)
    assert set(document["paths"]) == {
        stats.path,
        anomalies.path,
        "/health",
        "/ready",
        "/metrics",
        "/openapi.json",
    }
    assert is_open_route("/openapi.json")
