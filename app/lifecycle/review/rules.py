"""Rule-based AI review of coding applications: score, level, decision and a hashable report.

Rules (version :data:`RULE_VERSION`), all deterministic:

* Each factor yields a fraction in ``[0, 1]``; its contribution is ``weight * fraction`` and the
  weights sum to 100, so ``overall_score`` is in ``[0, 100]`` (rounded to 1 decimal).
  Factors: ``model_trust`` (registry trust weight, ``unknown_model_trust`` otherwise),
  ``model_version`` (semver-ish), ``content_hash`` (not low-entropy), ``storage_scheme``
  (s3/oss > https > ipfs > http), ``priority`` (``priority / 9``), ``title`` (present).
* A model matching a blacklist pattern: ``rejected``, score 0, level ``P``.
* Decision by score: ``>= approve_threshold`` approved, ``>= human_threshold`` need_human,
  below rejected.
* Level: ``O`` (fast path, coded within seconds) = approved and a registry model with trust
  ``>= fast_path_min_trust``, a well-formed version and no flags; ``G`` = any other approval;
  ``P`` = need_human or rejected (protected: stricter checks before any code is issued).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import orjson
from pydantic import ValidationError

from app.lifecycle.review.settings import ReviewSettings, get_review_settings
from app.platform.errors import SchemaViolation
from schemas.apply import ApplyCreated
from schemas.review import ReviewTaskFinished
from schemas.types import Decision, FinalLevel

__all__ = [
    "RULE_VERSION",
    "ReviewOutcome",
    "canonical_json",
    "report_hash",
    "review_application",
]

RULE_VERSION: Final = "avcc-review-rules/1"

_SCHEME_TRUST: Final[Mapping[str, float]] = MappingProxyType(
    {"s3": 1.0, "oss": 1.0, "https": 0.8, "ipfs": 0.5, "http": 0.3}
)
_SEMVER: Final = re.compile(r"v?[0-9]+(?:\.[0-9]+){0,2}(?:[-+][0-9A-Za-z.-]+)?")
_MIN_HASH_ENTROPY: Final = 3.0  # bits per hex digit; random 64-digit hex is about 3.8


@dataclass(frozen=True)
class ReviewOutcome:
    """Result of one review; ``report`` is the JSON document whose hash is ``report_hash``."""

    request_id: str
    avcc_record_id: int
    overall_score: float
    final_level: FinalLevel
    decision: Decision
    flags: tuple[str, ...]
    report: dict[str, Any]
    report_hash: str

    def finished(self, review_report_id: int) -> ReviewTaskFinished:
        """The ``topic.review.task.finished`` payload for this outcome."""
        return ReviewTaskFinished(
            request_id=self.request_id,
            avcc_record_id=self.avcc_record_id,
            review_report_id=review_report_id,
            decision=self.decision,
            final_level=self.final_level,
            overall_score=self.overall_score,
            report_hash=self.report_hash,
        )


def canonical_json(document: Any) -> bytes:
    """Canonical JSON: sorted keys, no spaces (orjson)."""
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)


def report_hash(report: Mapping[str, Any]) -> str:
    """``"sha256:" + sha256(canonical JSON of report)``."""
    return "sha256:" + hashlib.sha256(canonical_json(dict(report))).hexdigest()


def _hex_entropy(content_hash: str) -> float:
    digits = content_hash.removeprefix("sha256:")
    counts = Counter(digits)
    return -sum(n / len(digits) * math.log2(n / len(digits)) for n in counts.values())


def _coerce(payload: ApplyCreated | Mapping[str, Any]) -> ApplyCreated:
    if isinstance(payload, ApplyCreated):
        return payload
    try:
        return ApplyCreated.model_validate(dict(payload))
    except ValidationError as exc:
        fields = [".".join(str(part) for part in err["loc"]) for err in exc.errors()]
        raise SchemaViolation(f"invalid application: {', '.join(fields)}", fields) from None


def review_application(
    payload: ApplyCreated | Mapping[str, Any], config: ReviewSettings | None = None
) -> ReviewOutcome:
    """Review an application (an :class:`ApplyCreated` or its JSON dict; ``SchemaViolation`` if invalid)."""
    cfg = config or get_review_settings()
    app = _coerce(payload)
    model = app.ai_tool_info.model_name.strip().lower()
    version = app.ai_tool_info.model_version.strip()
    scheme = app.content_url.split("://", 1)[0].lower()
    entropy = round(_hex_entropy(app.content_hash), 4)
    in_registry = model in cfg.registry
    trust = cfg.registry.get(model, cfg.unknown_model_trust)
    version_ok = _SEMVER.fullmatch(version) is not None
    hash_ok = entropy >= _MIN_HASH_ENTROPY
    blacklisted = cfg.is_blacklisted(model)
    has_title = app.title is not None and bool(app.title.strip())

    observed: dict[str, tuple[Any, float]] = {
        "model_trust": ({"model_name": model, "in_registry": in_registry, "trust": trust}, trust),
        "model_version": (version, 1.0 if version_ok else 0.0),
        "content_hash": ({"hex_entropy_bits": entropy}, 1.0 if hash_ok else 0.0),
        "storage_scheme": (scheme, _SCHEME_TRUST.get(scheme, 0.0)),
        "priority": (app.priority, app.priority / 9),
        "title": (has_title, 1.0 if has_title else 0.0),
    }
    factors = [
        {
            "name": name,
            "weight": cfg.weights[name],
            "observed": value,
            "fraction": round(fraction, 4),
            "contribution": round(cfg.weights[name] * fraction, 4),
        }
        for name, (value, fraction) in observed.items()
    ]
    flags = tuple(
        flag
        for flag, raised in (
            ("blacklisted_model", blacklisted),
            ("unknown_model", not in_registry),
            ("malformed_model_version", not version_ok),
            ("low_entropy_content_hash", not hash_ok),
            ("insecure_content_url", scheme == "http"),
        )
        if raised
    )

    decision: Decision
    level: FinalLevel
    if blacklisted:
        score, decision, level = 0.0, "rejected", "P"
    else:
        score = round(min(100.0, max(0.0, sum(cfg.weights[n] * f for n, (_, f) in observed.items()))), 1)
        if score >= cfg.approve_threshold:
            decision = "approved"
            fast = in_registry and trust >= cfg.fast_path_min_trust and not flags
            level = "O" if fast else "G"
        else:
            decision = "need_human" if score >= cfg.human_threshold else "rejected"
            level = "P"

    report: dict[str, Any] = {
        "rule_version": RULE_VERSION,
        "request_id": app.request_id,
        "avcc_record_id": app.avcc_record_id,
        "content_hash": app.content_hash,
        "factors": factors,
        "flags": list(flags),
        "thresholds": cfg.as_report(),
        "overall_score": score,
        "decision": decision,
        "final_level": level,
    }
    return ReviewOutcome(
        request_id=app.request_id,
        avcc_record_id=app.avcc_record_id,
        overall_score=score,
        final_level=level,
        decision=decision,
        flags=flags,
        report=report,
        report_hash=report_hash(report),
    )
