"""Settings of the review group: the model registry, the blacklist, the factor weights and the
decision thresholds of the rule-based review (:mod:`app.lifecycle.review.rules`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any, Final

from app.platform.errors import ConfigurationError

__all__ = ["DEFAULT_BLACKLIST", "DEFAULT_REGISTRY", "DEFAULT_WEIGHTS", "ReviewConfig"]

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


@dataclass(frozen=True)
class ReviewConfig:
    """Model registry, blacklist, factor weights and decision thresholds."""

    registry: Mapping[str, float] = field(default_factory=lambda: DEFAULT_REGISTRY)
    blacklist: tuple[str, ...] = DEFAULT_BLACKLIST
    weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_WEIGHTS)
    unknown_model_trust: float = 0.4
    approve_threshold: float = 80.0
    human_threshold: float = 60.0
    fast_path_min_trust: float = 0.8

    def __post_init__(self) -> None:
        if set(self.weights) != set(DEFAULT_WEIGHTS):
            raise ConfigurationError(f"review weights must name exactly {sorted(DEFAULT_WEIGHTS)}")
        if any(w < 0 for w in self.weights.values()) or not math.isclose(sum(self.weights.values()), 100.0):
            raise ConfigurationError("review weights must be >= 0 and sum to 100")
        if not 0.0 <= self.human_threshold <= self.approve_threshold <= 100.0:
            raise ConfigurationError("need 0 <= human_threshold <= approve_threshold <= 100")
        trusts = [*self.registry.values(), self.unknown_model_trust, self.fast_path_min_trust]
        if any(not 0.0 <= t <= 1.0 for t in trusts):
            raise ConfigurationError("trust weights must be in [0, 1]")

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
