"""Service-level objectives (``AVCC_SLO_*``): time to code per level, and the wait for a person.

The seed promises O-level works their AVCC code within seconds ("O类作品秒级赋码"); G and P
works decided without a person get their answer within a minute. Each objective counts the
records of its level that no person decided (``review="ai"``): a work waiting for a reviewer is
held to :attr:`SloSettings.human_wait_max_s` instead. A target must be a bucket bound of the
time-to-code histogram, so compliance is counted exactly, never interpolated.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.metrics import TIME_TO_CODE_BUCKETS
from app.platform.settings import SettingsGetter, cached_settings

__all__ = ["GOOD_OUTCOMES", "LEVELS", "LevelObjective", "SloSettings", "get_slo_settings"]

#: The final levels (``schemas.types.FinalLevel``), fastest first.
LEVELS: Final = ("O", "G", "P")

#: Final answers that meet an objective when in time: the code, or a refusal.
GOOD_OUTCOMES: Final = ("issued", "rejected")


class LevelObjective(BaseModel):
    """``objective`` of the level's records answered within ``target_s`` seconds."""

    model_config = ConfigDict(frozen=True)

    level: str
    target_s: float
    objective: float

    @property
    def budget(self) -> float:
        """The share of records allowed to take longer (the error budget)."""
        return round(1 - self.objective, 12)


class SloSettings(BaseSettings):
    """The objectives and the alerting thresholds built from them."""

    model_config = SettingsConfigDict(env_prefix="AVCC_SLO_", frozen=True, extra="ignore")

    targets_s: dict[str, float] = Field(
        default_factory=lambda: {"O": 5.0, "G": 60.0, "P": 60.0},
        description="Per final level, the seconds within which a work no person decided gets its "
        "final answer (O: the seed's 'coded within seconds'; each a bound of the time-to-code "
        "histogram), as JSON naming every level.",
    )
    objectives: dict[str, float] = Field(
        default_factory=lambda: dict.fromkeys(LEVELS, 0.99),
        description="Per final level, the share of those works that must be answered within its "
        "target (between 0 and 1), as JSON naming every level.",
    )
    human_wait_max_s: float = Field(
        3600.0,
        gt=0,
        description="Longest a need_human work may wait for a person (`AvccHumanReviewWaiting` fires "
        "past it; the console flags it).",
    )
    fast_burn_rate: float = Field(
        14.4,
        gt=1,
        description="Burn rate of the fast alert, over 1 h and 5 min (14.4: 2 % of a 30-day error "
        "budget in one hour, the SRE workbook's page).",
    )
    slow_burn_rate: float = Field(
        6.0,
        gt=1,
        description="Burn rate of the slow alert, over 6 h and 30 min (6: 5 % of a 30-day error "
        "budget in six hours).",
    )

    @field_validator("targets_s", "objectives")
    @classmethod
    def _every_level(cls, values: dict[str, float]) -> dict[str, float]:
        if set(values) != set(LEVELS):
            raise ValueError(f"must name every level, {', '.join(LEVELS)}, and no other")
        return values

    @field_validator("targets_s")
    @classmethod
    def _bucket_bounds(cls, targets: dict[str, float]) -> dict[str, float]:
        if any(seconds not in TIME_TO_CODE_BUCKETS for seconds in targets.values()):
            bounds = ", ".join(f"{b:g}" for b in TIME_TO_CODE_BUCKETS)
            raise ValueError(f"each must be one of the time-to-code histogram's bounds: {bounds}")
        return targets

    @field_validator("objectives")
    @classmethod
    def _shares(cls, objectives: dict[str, float]) -> dict[str, float]:
        if any(not 0 < share < 1 for share in objectives.values()):
            raise ValueError("each must be above 0 and below 1")
        return objectives

    def levels(self) -> tuple[LevelObjective, ...]:
        """The objective of each level, fastest first."""
        return tuple(
            LevelObjective(level=level, target_s=self.targets_s[level], objective=self.objectives[level])
            for level in LEVELS
        )


#: The process's service-level settings.
get_slo_settings: SettingsGetter[SloSettings] = cached_settings(SloSettings)
