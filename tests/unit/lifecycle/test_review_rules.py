"""Rule-based AI review: fast path, borderline, blacklist, report hashing, score bounds."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.lifecycle.review.rules import RULE_VERSION, report_hash, review_application
from app.lifecycle.review.settings import ReviewSettings
from app.platform.errors import ConfigurationError, SchemaViolation
from schemas.apply import ApplyCreated
from tests.unit.lifecycle.applications import application_fields as payload


def test_o_level_fast_path() -> None:
    out = review_application(payload())
    assert (out.decision, out.final_level) == ("approved", "O")
    assert out.overall_score >= 80
    assert out.flags == ()
    assert out.report["rule_version"] == RULE_VERSION
    assert out.finished(5001).final_level == "O"


def test_model_instance_accepted() -> None:
    assert review_application(ApplyCreated.model_validate(payload())) == review_application(payload())


def test_approved_with_flag_is_g() -> None:
    out = review_application(payload(content_url="http://cdn.example/w.mp4", priority=9))
    assert (out.decision, out.final_level) == ("approved", "G")
    assert "insecure_content_url" in out.flags


def test_borderline_needs_human() -> None:
    out = review_application(payload(tool={"model_name": "homebrew-gan"}, content_url="https://x.example/a"))
    assert 60 <= out.overall_score < 80
    assert (out.decision, out.final_level) == ("need_human", "P")
    assert "unknown_model" in out.flags


def test_low_score_rejected() -> None:
    out = review_application(
        payload(
            tool={"model_name": "homebrew", "model_version": "latest"},
            content_hash="sha256:" + "0" * 64,
            content_url="http://x.example/a",
            priority=0,
            title=None,
        )
    )
    assert out.overall_score < 60
    assert (out.decision, out.final_level) == ("rejected", "P")
    assert "low_entropy_content_hash" in out.flags


@pytest.mark.parametrize("name", ["deepfake-pro", "DeepFake-v2", "super-faceswap", "voice-clone-x"])
def test_blacklist_rejected_with_zero(name: str) -> None:
    out = review_application(payload(tool={"model_name": name}))
    assert (out.decision, out.final_level, out.overall_score) == ("rejected", "P", 0.0)
    assert "blacklisted_model" in out.flags


def test_report_lists_each_factor() -> None:
    report = review_application(payload()).report
    names = [f["name"] for f in report["factors"]]
    assert names == ["model_trust", "model_version", "content_hash", "storage_scheme", "priority", "title"]
    total = sum(f["contribution"] for f in report["factors"])
    assert round(total, 1) == report["overall_score"]
    assert all({"weight", "observed", "contribution"} <= f.keys() for f in report["factors"])


def test_report_hash_stable_and_canonical() -> None:
    a, b = review_application(payload()), review_application(payload())
    assert a.report_hash == b.report_hash == report_hash(a.report)
    canonical = orjson.dumps(a.report, option=orjson.OPT_SORT_KEYS)
    assert b" " not in canonical.replace(b"Sunrise", b"")
    assert a.report_hash == "sha256:" + hashlib.sha256(canonical).hexdigest()
    reordered = dict(reversed(list(a.report.items())))
    assert report_hash(reordered) == a.report_hash
    assert review_application(payload(priority=4)).report_hash != a.report_hash


def test_invalid_payload_is_schema_violation() -> None:
    with pytest.raises(SchemaViolation) as info:
        review_application(payload(priority=11))
    assert "priority" in info.value.fields


def test_bad_config_refused() -> None:
    with pytest.raises(ConfigurationError):
        ReviewSettings(approve_threshold=50, human_threshold=70)
    with pytest.raises(ConfigurationError):
        ReviewSettings(weights={"model_trust": 100.0})


def test_custom_registry() -> None:
    cfg = ReviewSettings(registry={"homebrew-gan": 0.95})
    out = review_application(payload(tool={"model_name": "homebrew-gan"}), cfg)
    assert out.final_level == "O"


_hex = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)


@given(
    name=st.sampled_from(["sora", "suno", "unknown", "deepfake-x", "kling"]),
    version=st.sampled_from(["1", "v2.1", "2.0.0-beta", "latest", "x.y"]),
    digest=_hex,
    url=st.sampled_from(["s3://b/k", "oss://b/k", "https://h/p", "http://h/p", "ipfs://cid"]),
    priority=st.integers(min_value=0, max_value=9),
    title=st.one_of(st.none(), st.just("t"), st.just("  ")),
)
def test_score_bounds_and_consistency(
    name: str, version: str, digest: str, url: str, priority: int, title: str | None
) -> None:
    app = payload(
        tool={"model_name": name, "model_version": version},
        content_hash="sha256:" + digest,
        content_url=url,
        priority=priority,
        title=title,
    )
    out = review_application(app)
    assert 0.0 <= out.overall_score <= 100.0
    assert out.overall_score == round(out.overall_score, 1)
    if out.decision == "approved":
        assert out.overall_score >= 80 and out.final_level in {"O", "G"}
    else:
        assert out.final_level == "P"
    assert out == review_application(app)
