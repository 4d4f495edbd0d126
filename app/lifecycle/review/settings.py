"""Settings of the review group (``AVCC_REVIEW_*``): the model registry, the blacklist, the factor
weights and the decision thresholds of the rule-based review (:mod:`app.lifecycle.review.rules`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any, Final, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.errors import ConfigurationError
from app.platform.settings import SettingsGetter, cached_settings

__all__ = [
    "DEFAULT_BLACKLIST",
    "DEFAULT_REGISTRY",
    "DEFAULT_WEIGHTS",
    "ReviewSettings",
    "get_review_settings",
]

#: Known generative models and how much their output is trusted (0..1).
DEFAULT_REGISTRY: Final[Mapping[str, float]] = MappingProxyType(
    {
        "stable-diffusion-xl": 0.9,
        "stable-diffusion-3": 0.9,
        "midjourney": 0.85,
        "dall-e-3": 0.85,
        "sora": 0.85,
        "runway-gen3": 0.85,
        "kling": 0.85,
        "suno": 0.8,
        "udio": 0.8,
        "musicgen": 0.8,
    }
)
#: Case-insensitive ``fnmatch`` patterns of refused model names.
DEFAULT_BLACKLIST: Final = ("deepfake-*", "*faceswap*", "*voice-clone*")
#: Factor weights (sum 100).
DEFAULT_WEIGHTS: Final[Mapping[str, float]] = MappingProxyType(
    {
        "model_trust": 35.0,
        "model_version": 15.0,
        "content_hash": 20.0,
        "storage_scheme": 15.0,
        "priority": 10.0,
        "title": 5.0,
    }
)


class ReviewSettings(BaseSettings):
    """Model registry, blacklist, factor weights and decision thresholds. Each field maps to
    ``AVCC_REVIEW_<FIELD>`` (the mappings and the blacklist as JSON)."""

    model_config = SettingsConfigDict(env_prefix="AVCC_REVIEW_", frozen=True, extra="ignore")

    registry: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_REGISTRY),
        description="Known generative models and how much their output is trusted, 0 to 1 (JSON).",
    )
    blacklist: tuple[str, ...] = Field(
        DEFAULT_BLACKLIST, description="Case-insensitive fnmatch patterns of refused model names (JSON)."
    )
    weights: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_WEIGHTS),
        description="Weight of each review factor, naming every factor and summing to 100 (JSON).",
    )
    unknown_model_trust: float = Field(0.4, description="Trust of a model the registry does not name.")
    approve_threshold: float = Field(80.0, description="Score from which an application is approved.")
    human_threshold: float = Field(60.0, description="Score from which a person decides (below: rejected).")
    fast_path_min_trust: float = Field(
        0.8, description="Least trust of a registry model for the O-level fast path (coded within seconds)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if set(self.weights) != set(DEFAULT_WEIGHTS):
            raise ConfigurationError(f"review weights must name exactly {sorted(DEFAULT_WEIGHTS)}")
        if any(w < 0 for w in self.weights.values()) or not math.isclose(sum(self.weights.values()), 100.0):
            raise ConfigurationError("review weights must be >= 0 and sum to 100")
        if not 0.0 <= self.human_threshold <= self.approve_threshold <= 100.0:
            raise ConfigurationError("need 0 <= human_threshold <= approve_threshold <= 100")
        trusts = [*self.registry.values(), self.unknown_model_trust, self.fast_path_min_trust]
        if any(not 0.0 <= t <= 1.0 for t in trusts):
            raise ConfigurationError("trust weights must be in [0, 1]")
        return self

    def is_blacklisted(self, model_name: str) -> bool:
        """True if the (lower-cased) model name matches a blacklist pattern."""
        name = model_name.strip().lower()
        return any(fnmatchcase(name, pattern.lower()) for pattern in self.blacklist)

    def as_report(self) -> dict[str, Any]:
        """The thresholds, as written into every report."""
        return {
            "approve": self.approve_threshold,
            "human": self.human_threshold,
            "fast_path_min_trust": self.fast_path_min_trust,
            "unknown_model_trust": self.unknown_model_trust,
        }


#: The process's review settings.
get_review_settings: SettingsGetter[ReviewSettings] = cached_settings(ReviewSettings)
