"""Knobs of the anomaly detector (``AVCC_ANOMALY_*``): windows, rule thresholds, loop."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.playback.anomaly.rules import RuleConfig

__all__ = ["AnomalySettings"]


class AnomalySettings(BaseSettings):
    """Windows, rule thresholds and loop knobs. Each field maps to ``AVCC_ANOMALY_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_ANOMALY_", frozen=True, extra="ignore")

    window_s: int = Field(default=60, ge=1, description="Tumbling window length (event time).")
    lateness_windows: int = Field(
        default=2, ge=0, description="A window closes when the watermark passes its end + this many windows."
    )
    max_future_s: int = Field(
        default=600, ge=0, description="Events further ahead of the wall clock are skipped."
    )
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
        default_factory=lambda: {"play": 86_400, "complete": 86_400, "purchase": 86_400},
        description="impossible_duration: most seconds per event type (JSON).",
    )
    purchase_min_cny: float = Field(default=0.01, ge=0, description="revenue_out_of_bounds: lowest purchase.")
    purchase_max_cny: float = Field(
        default=10_000.0, gt=0, description="revenue_out_of_bounds: highest purchase."
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

    def rule_config(self) -> RuleConfig:
        """The thresholds as the rules take them."""
        return RuleConfig(
            window_ms=self.window_s * 1000,
            ewma_alpha=self.ewma_alpha,
            min_history_windows=self.min_history_windows,
            spike_factor=self.spike_factor,
            spike_min_count=self.spike_min_count,
            replay_min_count=self.replay_min_count,
            share_jump=self.share_jump,
            share_min_count=self.share_min_count,
            max_duration_sec=dict(self.max_duration_sec),
            purchase_min_cny=self.purchase_min_cny,
            purchase_max_cny=self.purchase_max_cny,
        )
