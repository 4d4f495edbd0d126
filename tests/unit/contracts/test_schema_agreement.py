"""The published JSON Schemas give the pipeline's verdict in standard validators (issue 26).

A corpus of valid and invalid events (``corpus/<topic>.json``: each case a name, the pipeline's
verdict ``valid`` and the whole envelope) is judged three ways: by the pipeline's own validator
(:func:`~app.platform.contracts.decode_event`, what the gateway and every consumer run), by python
``jsonschema`` and by ``ajv`` (npm, ``ajv/``, installed by ``scripts/install-deps.sh``), both with
formats asserted, on ``schemas/json`` (the envelope, then the topic's payload). All three agree on
every case but two kinds, each marked in the corpus and bounded here:

* ``unstated``: a rule JSON Schema cannot state (cross-field orders and sums, an integer written
  with a fraction beyond 2**53). The pipeline refuses, standard validators accept; the rules are
  :data:`UNSTATED_RULES`, so the list cannot grow unnoticed.
* ``beyond_js``: integers past 2**53, which JavaScript reads rounded; ajv is not asked.

Money given as JSON numbers is in the corpus both ways: whole amounts are valid everywhere, any
fraction (``12.5``, ``0.07``, ``1.005``) is refused everywhere (cents travel as strings).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
from jsonschema import Draft202012Validator

from app.contract_docs.generate import JSON_DIR, ROOT
from app.contract_docs.json_schemas import ENVELOPE_FILE, payload_file
from app.platform.contracts import PAYLOAD_MODELS, decode_event
from app.platform.errors import SchemaViolation, UndecodableMessage
from tests.conftest import in_ci

HERE: Final = Path(__file__).parent
CORPUS_DIR: Final = HERE / "corpus"
AJV_DIR: Final = HERE / "ajv"

#: Every rule the pipeline enforces that the JSON Schemas cannot state (see the module docstring).
UNSTATED_RULES: Final = frozenset(
    {
        "beyond 2**53 a JSON number with a fraction or exponent no longer states its digits",
        "cross-field order: period_end >= period_start",
        "cross-field order: window_end_ms >= window_start_ms",
        "split sums: sum(splits.amount_cny) == total_cny",
        "no party twice in splits",
    }
)


@dataclass(frozen=True, slots=True)
class Case:
    """One corpus entry."""

    key: str
    topic: str
    name: str
    valid: bool
    event: Any
    unstated: str | None
    beyond_js: bool

    @property
    def schema_valid(self) -> bool:
        """What a standard JSON Schema validator must answer."""
        return self.valid or self.unstated is not None


def load_corpus() -> list[Case]:
    """Every case, keyed ``<topic>#<index>`` like ``ajv/verdicts.mjs`` keys them."""
    cases = []
    for path in sorted(CORPUS_DIR.glob("*.json")):
        document = json.loads(path.read_text())
        topic = document["topic"]
        assert path.name == f"{topic}.json", path
        for index, item in enumerate(document["cases"]):
            cases.append(
                Case(
                    f"{topic}#{index}",
                    topic,
                    item["name"],
                    item["valid"],
                    item["event"],
                    item.get("unstated"),
                    bool(item.get("beyond_js")),
                )
            )
    return cases


def pipeline_verdict(case: Case) -> bool:
    """Whether the pipeline's validator accepts the event (from its JSON text, like on the wire)."""
    try:
        decode_event(case.topic, orjson.dumps(case.event))
    except (SchemaViolation, UndecodableMessage):
        return False
    return True


def jsonschema_verdicts(cases: list[Case]) -> dict[str, bool]:
    """python ``jsonschema`` on the published files (formats asserted)."""

    def validator(name: str) -> Draft202012Validator:
        schema = json.loads((ROOT / JSON_DIR / name).read_text())
        return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)

    envelope = validator(ENVELOPE_FILE)
    payloads = {topic: validator(payload_file(topic)) for topic in PAYLOAD_MODELS}
    verdicts = {}
    for case in cases:
        valid = envelope.is_valid(case.event)
        body = case.event.get("payload") if isinstance(case.event, dict) else None
        if valid and isinstance(body, dict):
            valid = payloads[case.topic].is_valid(body)
        verdicts[case.key] = valid
    return verdicts


def ajv_verdicts() -> tuple[str, dict[str, bool]]:
    """``(validator name, verdicts)`` of ajv, run by node over the same files."""
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "node is not installed"
    elif not (AJV_DIR / "node_modules" / "ajv").is_dir():
        missing = f"ajv is not installed in {AJV_DIR.relative_to(ROOT)}"
    if missing is not None:
        if in_ci():
            pytest.fail(f"{missing}; scripts/install-deps.sh installs it", pytrace=False)
        pytest.skip(f"{missing} (run scripts/install-deps.sh)")
    assert node is not None
    done = subprocess.run(
        [node, str(AJV_DIR / "verdicts.mjs"), str(ROOT / JSON_DIR), str(CORPUS_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # ajv's strict mode has nothing to say about the schemas
    answer = json.loads(done.stdout)
    return answer["validator"], answer["verdicts"]


def test_corpus_covers_every_topic_both_ways_and_names_its_exceptions() -> None:
    cases = load_corpus()
    assert {c.topic for c in cases} == set(PAYLOAD_MODELS)
    for topic in PAYLOAD_MODELS:
        verdicts = {c.valid for c in cases if c.topic == topic}
        assert verdicts == {True, False}, topic
    names = Counter((c.topic, c.name) for c in cases)
    assert [name for name, count in names.items() if count > 1] == []
    assert {c.unstated for c in cases if c.unstated} == UNSTATED_RULES
    assert all(not c.valid for c in cases if c.unstated)
    money = [c for c in cases if "_cny" in c.name and isinstance(_money(c), float)]
    assert {c.valid for c in money} == {True, False}  # whole JSON numbers pass, fractions do not


def _money(case: Case) -> Any:
    payload = case.event.get("payload", {}) if isinstance(case.event, dict) else {}
    settlement = payload.get("settlement") or {}
    return payload.get("revenue_cny", settlement.get("total_cny"))


def test_pipeline_jsonschema_and_ajv_agree_on_the_corpus(request: pytest.FixtureRequest) -> None:
    cases = load_corpus()
    ajv_name, ajv = ajv_verdicts()
    python = jsonschema_verdicts(cases)
    disagreements = []
    for case in cases:
        pipeline = pipeline_verdict(case)
        answers = {"recorded": case.valid, "pipeline": pipeline, "jsonschema": python[case.key]}
        expected = {"recorded": case.valid, "pipeline": case.valid, "jsonschema": case.schema_valid}
        if not case.beyond_js:
            answers["ajv"], expected["ajv"] = ajv[case.key], case.schema_valid
        if answers != expected:
            disagreements.append(f"{case.key} {case.name!r}: {answers}")
    assert disagreements == [], "\n".join(disagreements)
    valid = sum(c.valid for c in cases)
    unstated = sum(c.unstated is not None for c in cases)
    beyond = sum(c.beyond_js for c in cases)
    line = (
        f"schema agreement: {len(cases)} cases over {len({c.topic for c in cases})} topics "
        f"({valid} valid, {len(cases) - valid} invalid): the pipeline, python jsonschema and {ajv_name} "
        f"agree on all; {unstated} of the invalid ones break rules JSON Schema cannot state "
        f"({len(UNSTATED_RULES)} rules), {beyond} integers past 2**53 not asked of ajv"
    )
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n" + line, flush=True)
