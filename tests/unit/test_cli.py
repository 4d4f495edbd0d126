"""The `avcc` CLI: topic plan, contract validation, exit codes."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from app.cli import main

DAY = 86_400_000


def run(*args: str, stdin: bytes | None = None) -> Any:
    return CliRunner().invoke(main, list(args), input=stdin)


def test_topics_plan_json_lists_the_seed_topics_with_their_layout() -> None:
    result = run("topics", "plan", "--json")
    assert result.exit_code == 0
    plan = {t["name"]: t for t in orjson.loads(result.output)}
    expected = {
        "topic.avcc.apply.created": (6, 7 * DAY),
        "topic.review.task.finished": (12, 7 * DAY),
        "topic.chain.tx.pending": (6, 7 * DAY),
        "topic.chain.tx.confirmed": (6, 30 * DAY),
        "topic.playback.event": (24, 3 * DAY),
        "topic.system.dlq": (3, -1),
        "topic.system.retry": (6, 7 * DAY),
    }
    for name, (partitions, retention) in expected.items():
        assert (plan[name]["partitions"], plan[name]["retention_ms"]) == (partitions, retention), name


def _h() -> str:
    return "sha256:" + hashlib.sha256(uuid.uuid4().bytes).hexdigest()


def envelope(payload: dict[str, Any], source: str = "code-svc") -> dict[str, Any]:
    return {"event_id": str(uuid.uuid4()), "timestamp": 1717312200000, "source": source, "payload": payload}


SEED_EXAMPLES = {
    "topic.avcc.apply.created": {
        "request_id": "req_20260602_001",
        "avcc_record_id": 10042,
        "content_url": "s3://aigc-hub-storage/works/raw/10042.mp4",
        "content_hash": _h(),
        "ai_tool_info": {"model_name": "Stable-Diffusion-XL", "model_version": "v1.0"},
        "priority": 5,
    },
    "topic.review.task.finished": {
        "request_id": "req_20260602_001",
        "avcc_record_id": 10042,
        "review_report_id": 5001,
        "decision": "approved",
        "final_level": "G",
        "overall_score": 78.5,
        "report_hash": _h(),
    },
    "topic.chain.tx.confirmed": {
        "avcc_record_id": 10042,
        "chain_type": "copyright_main",
        "tx_hash": "0x" + "ab" * 32,
        "block_height": 123456,
        "status": "success",
        "crd_address": "0x7f3e9a" + "0" * 34,
    },
    "topic.playback.event": {
        "avcc_code": "MA.156.10005.8361/AV0000000009NA.XXXXXXXXC",
        "platform_node": "8361",
        "user_hash": _h(),
        "event_type": "play",
        "duration_sec": 1800,
        "revenue_cny": 0.00,
    },
}


@pytest.mark.parametrize("topic", SEED_EXAMPLES)
def test_validate_accepts_the_seed_examples(topic: str) -> None:
    result = run("validate", topic, stdin=orjson.dumps(envelope(SEED_EXAMPLES[topic])))
    assert result.exit_code == 0, result.output


BAD = [
    ("topic.avcc.apply.created", {"priority": "5"}, "payload.priority"),
    ("topic.review.task.finished", {"decision": "maybe"}, "payload.decision"),
    ("topic.review.task.finished", {"final_level": "X"}, "payload.final_level"),
    ("topic.avcc.apply.created", {"content_hash": "sha256:abc123def456"}, "payload.content_hash"),
    ("topic.chain.tx.confirmed", {"tx_hash": "0xabc123"}, "payload.tx_hash"),
    ("topic.playback.event", {"duration_sec": -1}, "payload.duration_sec"),
    ("topic.playback.event", {"revenue_cny": 0.1 + 0.2}, "payload.revenue_cny"),
    ("topic.playback.event", {"event_type": "pause"}, "payload.event_type"),
    ("topic.chain.tx.confirmed", {"chain_type": "sidechain"}, "payload.chain_type"),
]


@pytest.mark.parametrize(("topic", "change", "field"), BAD, ids=[f for _, _, f in BAD])
def test_validate_rejects_with_exit_1_naming_the_field(
    topic: str, change: dict[str, Any], field: str
) -> None:
    payload = {**SEED_EXAMPLES[topic], **change}
    result = run("validate", topic, stdin=orjson.dumps(envelope(payload)))
    assert result.exit_code == 1
    assert field in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_validate_rejects_missing_fields_and_malformed_json() -> None:
    payload = dict(SEED_EXAMPLES["topic.avcc.apply.created"])
    del payload["content_hash"]
    missing = run("validate", "topic.avcc.apply.created", stdin=orjson.dumps(envelope(payload)))
    assert missing.exit_code == 1 and "payload.content_hash" in missing.stderr
    broken = run("validate", "topic.avcc.apply.created", stdin=b'{"event_id": ')
    assert broken.exit_code == 1 and broken.stderr.strip()
    no_event_id = {
        k: v for k, v in envelope(SEED_EXAMPLES["topic.playback.event"]).items() if k != "event_id"
    }
    result = run("validate", "topic.playback.event", stdin=orjson.dumps(no_event_id))
    assert result.exit_code == 1 and "event_id" in result.stderr


def test_validate_usage_errors_exit_2() -> None:
    assert run("validate").exit_code == 2
    assert run("validate", "topic.nope", stdin=b"{}").exit_code == 2


def test_kafka_acls_plan_prints_each_group_s_grants() -> None:
    from app.platform.kafka.acls import acl_plan

    result = run("kafka", "acls", "plan", "--json")
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.output) == [g.as_dict() for g in acl_plan()]
    gateway = run("kafka", "acls", "plan", "--group", "gateway")
    assert gateway.exit_code == 0
    lines = gateway.output.splitlines()[1:]
    assert lines and all(line.startswith("User:avcc-gateway ") for line in lines)
    assert any("WRITE" in line and "topic.playback.event" in line for line in lines)
    unknown = run("kafka", "acls", "plan", "--group", "nope")
    assert unknown.exit_code == 2 and "unknown group 'nope'" in unknown.output
