"""Settings of the anomaly group (``AVCC_ANOMALY_*``): the rules' thresholds, the detector's loop.

:class:`AnomalyRuleSettings` are what the pure rules and windows take (the window length, the
rule thresholds, how baselines are kept bounded); :class:`AnomalySettings` how the detector runs
(lateness, batches, commits, snapshots, its store).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.settings import SettingsGetter, cached_settings

__all__ = ["AnomalyRuleSettings", "AnomalySettings", "get_anomaly_rule_settings", "get_anomaly_settings"]

_DAY = 24 * 3600


class AnomalyRuleSettings(BaseSettings):
    """The window length and the rules' thresholds. Each field maps to ``AVCC_ANOMALY_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_ANOMALY_", frozen=True, extra="ignore")

    window_s: int = Field(default=60, ge=1, description="Tumbling window length (event time).")
    ewma_alpha: float = Field(
        default=0.3, gt=0, le=1, description="Weight of the newest window in baselines."
    )
    min_history_windows: int = Field(
        default=3, ge=1, description="Baseline windows before ratio rules apply."
    )
    spike_factor: float = Field(default=5.0, gt=1, description="traffic_spike: count >= factor x baseline.")
    spike_min_count: int = Field(default=100, ge=1, description="traffic_spike: minimum window count.")
    replay_min_count: int = Field(default=30, ge=2, description="user_replay: plays of one code by one user.")
    share_jump: float = Field(default=0.3, gt=0, le=1, description="node_share_jump: share - baseline share.")
    share_min_count: int = Field(default=200, ge=1, description="node_share_jump: minimum code count.")
    max_duration_sec: dict[str, int] = Field(
        default_factory=lambda: {"play": _DAY, "complete": _DAY, "purchase": _DAY},
        description="impossible_duration: most seconds per event type (JSON).",
    )
    purchase_min_cny: float = Field(default=0.01, ge=0, description="revenue_out_of_bounds: lowest purchase.")
    purchase_max_cny: float = Field(
        default=10_000.0, gt=0, description="revenue_out_of_bounds: highest purchase."
    )
    baseline_floor: float = Field(
        default=0.05, ge=0, description="Baseline entries whose EWMA decays below this are dropped."
    )
    baseline_max_codes: int = Field(
        default=200_000, ge=1, description="Most codes a (partial) baseline keeps; the smallest go beyond."
    )

    @cached_property
    def window_ms(self) -> int:
        """The window length in milliseconds."""
        return self.window_s * 1000


class AnomalySettings(BaseSettings):
    """How the detector runs. Each field maps to ``AVCC_ANOMALY_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_ANOMALY_", frozen=True, extra="ignore")

    lateness_windows: int = Field(
        default=2, ge=0, description="A window closes when the watermark passes its end + this many windows."
    )
    max_future_s: int = Field(
        default=600, ge=0, description="Events further ahead of the wall clock are skipped."
    )
    batch_size: int = Field(default=10_000, ge=1, description="Messages taken per consume call.")
    commit_interval_s: float = Field(default=5.0, gt=0, description="Snapshot + commit period.")
    snapshot_max_pairs: int = Field(
        default=20_000, ge=0, description="(code, user) counters kept per window in a snapshot."
    )
    gc_gen0_threshold: int = Field(
        default=50_000,
        ge=0,
        description="Gen-0 threshold of Python's GC set by a starting detector (process-wide; 0 "
        "keeps Python's 700). Young collections every ~100 events cost ~15% of its CPU.",
    )
    state_dir: Path | None = Field(
        default=None, description="Local snapshot store (default: <data_dir>/workers/anomaly/windows)."
    )


#: The process's anomaly rule settings.
get_anomaly_rule_settings: SettingsGetter[AnomalyRuleSettings] = cached_settings(AnomalyRuleSettings)
#: The process's anomaly detector settings.
get_anomaly_settings: SettingsGetter[AnomalySettings] = cached_settings(AnomalySettings)
