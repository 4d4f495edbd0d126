"""The compatibility gate: breaks are found and named, widenings pass, and it reads real git refs."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.cli import main
from app.contract_docs.check import check_against
from app.contract_docs.compat import Break, compare_documents, compare_sets
from app.contract_docs.generate import JSON_DIR, ROOT
from app.contract_docs.json_schemas import ENVELOPE_FILE, json_schema_files, payload_file
from app.platform import topics

APPLY = payload_file(topics.APPLY_CREATED.name)
REVIEW = payload_file(topics.REVIEW_TASK_FINISHED.name)
PLAYBACK = payload_file(topics.PLAYBACK_EVENT.name)


@pytest.fixture
def current() -> dict[str, dict[str, Any]]:
    return json_schema_files()


def changed(doc: dict[str, Any], edit: Any) -> dict[str, Any]:
    new = copy.deepcopy(doc)
    edit(new)
    return new


def lines(breaks: list[Break]) -> list[tuple[str, str]]:
    return [(b.field, b.change) for b in breaks]


def test_same_schemas_are_compatible(current: dict[str, dict[str, Any]]) -> None:
    assert compare_sets(current, json_schema_files()) == []


def test_removed_required_field_is_named(current: dict[str, dict[str, Any]]) -> None:
    def drop_priority(doc: dict[str, Any]) -> None:
        del doc["properties"]["priority"]
        doc["required"].remove("priority")

    breaks = compare_documents(APPLY, current[APPLY], changed(current[APPLY], drop_priority))
    assert lines(breaks) == [("payload.priority", "field removed")]
    assert breaks[0].line().startswith(f"{APPLY}: payload.priority: field removed")


def test_narrowed_type_is_named(current: dict[str, dict[str, Any]]) -> None:
    def integer_score(doc: dict[str, Any]) -> None:
        doc["properties"]["overall_score"]["type"] = "integer"

    breaks = compare_documents(REVIEW, current[REVIEW], changed(current[REVIEW], integer_score))
    assert lines(breaks) == [("payload.overall_score", "type narrowed")]


def test_optional_field_made_non_null_is_a_narrowed_type(current: dict[str, dict[str, Any]]) -> None:
    def no_null(doc: dict[str, Any]) -> None:
        doc["properties"]["title"] = doc["properties"]["title"]["anyOf"][0]

    breaks = compare_documents(APPLY, current[APPLY], changed(current[APPLY], no_null))
    assert lines(breaks) == [("payload.title", "type narrowed")]
    assert "null no longer accepted" in breaks[0].detail


def test_removed_enum_value_is_named(current: dict[str, dict[str, Any]]) -> None:
    def no_purchase(doc: dict[str, Any]) -> None:
        doc["properties"]["event_type"]["enum"].remove("purchase")

    breaks = compare_documents(PLAYBACK, current[PLAYBACK], changed(current[PLAYBACK], no_purchase))
    assert lines(breaks) == [("payload.event_type", "enum value removed")]
    assert breaks[0].detail == "'purchase'"


def test_new_required_field_is_named(current: dict[str, dict[str, Any]]) -> None:
    def title_required(doc: dict[str, Any]) -> None:
        doc["required"].append("title")

    breaks = compare_documents(APPLY, current[APPLY], changed(current[APPLY], title_required))
    assert lines(breaks) == [("payload.title", "new required field")]


def test_nested_definition_changes_are_named_by_their_path(current: dict[str, dict[str, Any]]) -> None:
    def shorter_name(doc: dict[str, Any]) -> None:
        doc["$defs"]["AiToolInfo"]["properties"]["model_name"]["maxLength"] = 64

    breaks = compare_documents(APPLY, current[APPLY], changed(current[APPLY], shorter_name))
    assert lines(breaks) == [("payload.ai_tool_info.model_name", "constraint narrowed")]


def test_envelope_fields_have_no_payload_prefix(current: dict[str, dict[str, Any]]) -> None:
    def stricter_source(doc: dict[str, Any]) -> None:
        doc["properties"]["source"]["pattern"] = "^[a-z]+-svc$"

    old = current[ENVELOPE_FILE]
    assert lines(compare_documents(ENVELOPE_FILE, old, changed(old, stricter_source))) == [
        ("source", "constraint narrowed")
    ]


def test_widening_changes_are_compatible(current: dict[str, dict[str, Any]]) -> None:
    def widen(doc: dict[str, Any]) -> None:
        doc["properties"]["event_type"]["enum"].append("refund")
        doc["properties"]["duration_sec"]["type"] = "number"
        doc["properties"]["duration_sec"]["maximum"] *= 2
        doc["properties"]["note"] = {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
        doc["required"].remove("revenue_cny")
        doc["description"] = "reworded"

    assert compare_documents(PLAYBACK, current[PLAYBACK], changed(current[PLAYBACK], widen)) == []


def test_removed_topic_is_a_break(current: dict[str, dict[str, Any]]) -> None:
    new = {k: v for k, v in current.items() if k != PLAYBACK}
    assert lines(compare_sets(current, new)) == [("(topic)", "topic removed")]


# --- against git refs ----------------------------------------------------------------------------


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def commit_schemas(root: Path, files: dict[str, dict[str, Any]]) -> None:
    directory = root / JSON_DIR
    directory.mkdir(parents=True, exist_ok=True)
    for name, doc in files.items():
        (directory / name).write_text(json.dumps(doc))
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "schemas")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    return tmp_path


def test_ref_with_an_older_wider_contract_fails_naming_fields(
    repo: Path, current: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """At the ref, apply.created had an extra field and no required priority: both are breaks now."""

    def older(doc: dict[str, Any]) -> None:
        doc["properties"]["legacy_tag"] = {"type": "string"}
        doc["required"].remove("priority")

    commit_schemas(repo, {**current, APPLY: changed(current[APPLY], older)})
    assert check_against("HEAD", root=repo) == 1
    err = capsys.readouterr().err
    assert f"incompatible: {APPLY}: payload.legacy_tag: field removed" in err
    assert f"incompatible: {APPLY}: payload.priority: new required field" in err


def test_ref_with_the_same_contract_passes(
    repo: Path, current: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    commit_schemas(repo, current)
    assert check_against("HEAD", root=repo) == 0
    assert f"{len(current)} schema(s) compared" in capsys.readouterr().out


def test_ref_without_published_schemas_passes(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (repo / "README.md").write_text("x")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "init")
    assert check_against("HEAD", root=repo) == 0
    assert "publishes no schemas/json" in capsys.readouterr().out


def test_unknown_ref_is_a_usage_error(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_against("no-such-ref", root=repo) == 2
    assert "no-such-ref" in capsys.readouterr().err


def test_cli_against_this_checkouts_head_passes() -> None:
    """``avcc contracts check --against HEAD~0``: the committed schemas against the models."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    result = CliRunner().invoke(main, ["contracts", "check", "--against", "HEAD~0"])
    assert result.exit_code == 0, result.output
    assert "compatible with HEAD~0" in result.output


def test_a_narrowed_branch_of_a_union_is_named(current: dict[str, dict[str, Any]]) -> None:
    def whole_yuan_strings(doc: dict[str, Any]) -> None:
        doc["properties"]["revenue_cny"]["anyOf"][0]["pattern"] = "^[0-9]{1,12}$"

    breaks = compare_documents(PLAYBACK, current[PLAYBACK], changed(current[PLAYBACK], whole_yuan_strings))
    assert lines(breaks) == [("payload.revenue_cny", "constraint narrowed")]


def test_a_new_cross_field_rule_is_a_break(current: dict[str, dict[str, Any]]) -> None:
    rule = {"if": {"required": ["title"]}, "then": {"required": ["media_type"]}}

    new = changed(current[APPLY], lambda doc: doc.update(allOf=[rule]))
    assert lines(compare_documents(APPLY, current[APPLY], new)) == [("payload", "rule added")]


def test_patterns_published_for_every_engine_are_the_same_language(
    current: dict[str, dict[str, Any]],
) -> None:
    """``^x$(?!\\n)`` is ``^x$`` in ECMA-262: publishing it for Python's ``re`` breaks nothing."""

    def bare_dollar(doc: dict[str, Any]) -> None:
        node = doc["properties"]["user_hash"]
        node["pattern"] = node["pattern"].removesuffix(r"(?!\n)")

    assert compare_documents(PLAYBACK, changed(current[PLAYBACK], bare_dollar), current[PLAYBACK]) == []


def test_acknowledged_narrowings_pass_and_others_still_fail(
    repo: Path, current: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """The schemas as published before issue 26 (money numbers with cents, ``\\S``) narrow on
    purpose and pass with their reason; a narrowing nobody acknowledged in the same run fails."""

    def before_issue_26(doc: dict[str, Any]) -> None:
        doc["properties"]["revenue_cny"]["anyOf"][1]["type"] = "number"

    def and_a_refund(doc: dict[str, Any]) -> None:
        before_issue_26(doc)
        doc["properties"]["event_type"]["enum"].append("refund")

    commit_schemas(repo, {**current, PLAYBACK: changed(current[PLAYBACK], before_issue_26)})
    assert check_against("HEAD", root=repo) == 0
    out = capsys.readouterr().out
    assert f"acknowledged: {PLAYBACK}: payload.revenue_cny: type narrowed (number no longer accepted)" in out
    assert "cents as decimal strings" in out

    commit_schemas(repo, {**current, PLAYBACK: changed(current[PLAYBACK], and_a_refund)})
    assert check_against("HEAD", root=repo) == 1
    assert f"incompatible: {PLAYBACK}: payload.event_type: enum value removed" in capsys.readouterr().err
