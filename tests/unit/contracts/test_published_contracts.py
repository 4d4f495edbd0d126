"""The published contracts: fresh, valid JSON Schema / AsyncAPI, and as strict as the models.

The examples of ``schemas/examples`` must pass both the JSON Schemas and ``avcc validate``; the
contract breaks of ``tests/unit/schemas/test_schemas.py`` must fail the JSON Schemas naming the
same field that ``avcc validate`` names, except for the few rules JSON Schema cannot state.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from jsonschema import Draft202012Validator, ValidationError

from app.contract_docs.asyncapi import build_asyncapi, channel_id
from app.contract_docs.examples import load_examples
from app.contract_docs.generate import ASYNCAPI_FILE, JSON_DIR, ROOT, stale_files
from app.contract_docs.json_schemas import ENVELOPE_FILE, json_schema_files, payload_file
from app.platform import topics
from app.platform.contracts import PAYLOAD_MODELS, decode_event
from app.platform.errors import SchemaViolation
from app.platform.flows import TOPIC_FLOWS
from app.platform.groups import GROUPS
from app.platform.internal_topics import group_app
from tests.conftest import in_ci
from tests.unit.schemas.test_schemas import REJECTIONS, raw_event, set_path

CONTRACTS_DIR = ROOT / "deploy" / "contracts"

#: Breaks that only the models catch, each with why JSON Schema cannot state the rule.
MODEL_ONLY: dict[tuple[str, str, str], str] = {
    (topics.APPLY_CREATED.name, "payload.avcc_record_id", str(float(2**53 + 2))): (
        "beyond 2**53 a JSON number with a fraction or exponent no longer states its digits"
    ),
    (topics.ANOMALY.name, "payload.window_end_ms", str(1717312200000 - 1)): "cross-field order",
}


def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((ROOT / JSON_DIR / name).read_text()))


def _fields(error: ValidationError, prefix: tuple[str, ...]) -> list[str]:
    """The field(s) a JSON Schema error is about, spelled like ``SchemaViolation.fields``."""
    if error.validator in {"anyOf", "oneOf"} and error.context:
        # Branches of another JSON type say nothing; the others name the fields inside.
        depth = len(error.absolute_path)
        inner = [c for c in error.context if not (c.validator == "type" and len(c.absolute_path) == depth)]
        if inner:
            return [field for sub in inner for field in _fields(sub, prefix)]
    path = [*prefix, *(str(p) for p in error.absolute_path)]
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        return [".".join([*path, name]) for name in error.validator_value if name not in instance]
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = error.schema.get("properties", {})
        return [".".join([*path, name]) for name in instance if name not in known]
    return [".".join(path)]


def json_schema_fields(topic: str, event: Any) -> set[str]:
    """Fields the published JSON Schemas reject in ``event`` (envelope, then the topic's payload)."""
    fields: set[str] = set()
    for error in _validator(ENVELOPE_FILE).iter_errors(event):
        fields.update(_fields(error, ()))
    payload = event.get("payload") if isinstance(event, dict) else None
    if isinstance(payload, dict):
        for error in _validator(payload_file(topic)).iter_errors(payload):
            fields.update(_fields(error, ("payload",)))
    return fields


# --- artefacts are fresh and well-formed ------------------------------------------------------


def test_generated_files_are_fresh() -> None:
    assert stale_files() == [], "run `python -m app.contract_docs` and commit the result"


def test_one_schema_per_payload_topic_and_the_envelope() -> None:
    expected = {ENVELOPE_FILE, *(payload_file(t) for t in PAYLOAD_MODELS)}
    assert {p.name for p in (ROOT / JSON_DIR).glob("*.json")} == expected
    for name, document in json_schema_files().items():
        Draft202012Validator.check_schema(document)
        assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema", name


def test_asyncapi_yaml_is_the_built_document() -> None:
    text = (ROOT / ASYNCAPI_FILE).read_text()
    assert yaml.safe_load(text) == json.loads(json.dumps(build_asyncapi()))


def test_asyncapi_describes_every_topic_of_the_plan() -> None:
    doc = build_asyncapi()
    for spec in topics.TOPIC_PLAN:
        channel = doc["channels"][channel_id(spec.name)]
        kafka = channel["bindings"]["kafka"]
        assert (channel["address"], kafka["partitions"]) == (spec.name, spec.partitions)
        assert kafka["topicConfiguration"]["retention.ms"] == spec.retention_ms
        assert channel["x-avcc-key"] == spec.key_field
        ref = f"#/channels/{channel_id(spec.name)}"
        operations = [o for o in doc["operations"].values() if o["channel"]["$ref"] == ref]
        flow = TOPIC_FLOWS[spec.name]
        assert sum(o["action"] == "receive" for o in operations) == len(flow.consumers)
        assert sum(o["action"] == "send" for o in operations) == len(flow.producers) + len(flow.redeliverers)
    headers = doc["components"]["schemas"]["FailureHeaders"]["properties"]
    assert {"avcc-original-topic", "avcc-attempt", "avcc-retry-round"} <= set(headers)
    examples = doc["components"]["messages"]["ApplyCreated"]["examples"]
    assert examples == load_examples()[topics.APPLY_CREATED.name]


def test_declared_consumers_include_what_the_agents_subscribe() -> None:
    assert set(TOPIC_FLOWS) == {spec.name for spec in topics.TOPIC_PLAN}
    for group in GROUPS:
        for agent in group_app(group).agents.values():
            for topic in getattr(agent.channel, "topics", ()) or ():
                if topic in TOPIC_FLOWS:
                    assert group.name in TOPIC_FLOWS[topic].consumers, (group.name, topic)


# --- examples and contract breaks ---------------------------------------------------------------


def _examples() -> list[tuple[str, str, dict[str, Any]]]:
    return [(t, e["name"], e["payload"]) for t, items in load_examples().items() for e in items]


def _example_id(value: Any) -> str:
    return value if isinstance(value, str) else ""


@pytest.mark.parametrize(("topic", "name", "event"), _examples(), ids=_example_id)
def test_example_validates_against_schema_and_model(topic: str, name: str, event: dict[str, Any]) -> None:
    assert json_schema_fields(topic, event) == set(), name
    decode_event(topic, orjson.dumps(event))


def test_every_seed_topic_has_an_example() -> None:
    seed = (topics.APPLY_CREATED, topics.REVIEW_TASK_FINISHED, topics.CHAIN_TX_CONFIRMED)
    assert {s.name for s in (*seed, topics.PLAYBACK_EVENT)} <= set(load_examples())


@pytest.mark.parametrize(("topic", "path", "value", "field"), REJECTIONS)
def test_json_schema_names_the_field_validate_names(topic: str, path: str, value: Any, field: str) -> None:
    event = raw_event(topic)
    set_path(event, path, value)
    with pytest.raises(SchemaViolation) as info:
        decode_event(topic, orjson.dumps(event))
    assert field in info.value.fields
    named = json_schema_fields(topic, event)
    reason = MODEL_ONLY.get((topic, path, str(value)))
    if reason is not None:
        assert field not in named, f"{field} is now caught by JSON Schema: drop it from MODEL_ONLY"
    else:
        assert field in named, (named, str(info.value))


def test_model_only_rules_are_few_and_all_used() -> None:
    used = {(t, p, str(v)) for t, p, v, _ in REJECTIONS}
    assert set(MODEL_ONLY) <= used
    assert len(MODEL_ONLY) <= len(REJECTIONS) // 10


# --- the reference AsyncAPI parser ------------------------------------------------------------------


def _missing(what: str) -> None:
    if in_ci():
        pytest.fail(f"{what}; scripts/install-deps.sh installs it", pytrace=False)
    pytest.skip(f"{what} (run scripts/install-deps.sh)")


def _parse(path: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None:
        _missing("node is not installed")
    if not (CONTRACTS_DIR / "node_modules" / "@asyncapi" / "parser").is_dir():
        _missing("@asyncapi/parser is not installed in deploy/contracts")
    script = str(CONTRACTS_DIR / "validate.mjs")
    return subprocess.run([str(node), script, str(path)], capture_output=True, text=True, timeout=120)


def test_asyncapi_parser_accepts_the_document() -> None:
    done = _parse(ROOT / ASYNCAPI_FILE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "valid: AsyncAPI 3.0.0" in done.stdout
    assert f"{len(topics.TOPIC_PLAN)} channels" in done.stdout


def test_asyncapi_parser_rejects_a_broken_reference(tmp_path: Path) -> None:
    broken = (ROOT / ASYNCAPI_FILE).read_text().replace("#/components/messages/ApplyCreated", "#/nope", 1)
    (tmp_path / "asyncapi.yaml").write_text(broken)
    done = _parse(tmp_path / "asyncapi.yaml")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "#/nope" in done.stdout
