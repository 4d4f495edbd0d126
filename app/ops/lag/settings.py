"""Lag monitor settings: the alert rules of seed 9.3.4 and the ``AVCC_LAG_*`` knobs of the monitor
(how every worker reads lag: :mod:`app.platform.lag.settings`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.faust.app import consumer_group_id
from app.platform.lag.reader import WatchedGroups
from app.platform.settings import SettingsGetter, cached_settings
from app.platform.topics import APPLY_CREATED, PLAYBACK_EVENT, spec_for

__all__ = ["LagRule", "LagSettings", "default_rules", "get_lag_settings"]


class LagRule(BaseModel):
    """One alert rule on the lag of ``topic`` as consumed by each group of ``groups``.

    It fires for a (group, topic) while the total lag over the topic's partitions is above
    ``max_lag``, or while the lag has been > 0 (at least ``not_shrinking_min_lag``) and has not
    shrunk (least-squares slope >= 0) for ``not_shrinking_s`` seconds.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Alert name (label `alertname`).")
    topic: str = Field(description="Topic whose lag is watched.")
    groups: tuple[str, ...] = Field(description="Kafka consumer group ids (e.g. `avcc-review`).")
    max_lag: int | None = Field(None, description="Fire when the total lag exceeds this.")
    not_shrinking_s: float | None = Field(
        None, description="Fire when lag > 0 has not shrunk for this many seconds."
    )
    not_shrinking_min_lag: int = Field(1, description="Lag from which the not-shrinking rule applies.")
    severity: str = Field("P2", description="Label `severity`.")
    summary: str = Field("", description="Annotation `summary`.")
    action: str = Field("", description="Annotation `recommendation`: what the operator should do.")
    scale_group: str | None = Field(None, description="Agent group to scale out (label `scale_group`).")


def default_rules() -> tuple[LagRule, ...]:
    """The seed's rules (9.3.4), keyed by the topic plan's names and partition counts."""
    apply_parts = spec_for(APPLY_CREATED.name).partitions
    playback_parts = spec_for(PLAYBACK_EVENT.name).partitions
    return (
        LagRule(
            name="AvccApplyCreatedLag",
            topic=APPLY_CREATED.name,
            groups=(consumer_group_id("review"),),
            max_lag=1000,
            not_shrinking_s=60.0,
            severity="P2",
            summary="review-svc is falling behind on applications (O-class works must be coded in seconds)",
            action=f"scale out review-svc: add `avcc worker review` replicas (KEDA does it automatically; "
            f"at most {apply_parts} = partitions of {APPLY_CREATED.name})",
            scale_group="review",
        ),
        LagRule(
            name="AvccPlaybackEventLag",
            topic=PLAYBACK_EVENT.name,
            groups=(consumer_group_id("sink"), consumer_group_id("anomaly")),
            max_lag=50_000,
            severity="P2",
            summary="playback events pile up",
            action="check the ClickHouse sink: insert latency and failures "
            "(avcc_clickhouse_insert_seconds / avcc_clickhouse_insert_failures_total), then scale out "
            f"(at most {playback_parts} = partitions of {PLAYBACK_EVENT.name})",
        ),
    )


class LagSettings(BaseSettings):
    """Lag monitor knobs, read from ``AVCC_LAG_*`` environment variables.

    ``AVCC_LAG_RULES`` is a JSON list of :class:`LagRule` objects and replaces the defaults.
    """

    model_config = SettingsConfigDict(env_prefix="AVCC_LAG_", frozen=True, extra="ignore")

    rules: tuple[LagRule, ...] = Field(
        default_factory=default_rules, description="Alert rules as JSON (default: the seed's 9.3.4)."
    )
    interval_s: float = Field(5.0, description="Seconds between two snapshots.")
    window_s: float = Field(60.0, description="Evaluation window of the WARN/STALL/STOP status.")
    repeat_s: float = Field(300.0, description="Re-send a still-active alert this often.")
    group_prefix: str = Field("", description="Only watch groups whose id starts with this.")

    @property
    def history_s(self) -> float:
        """How far back the evaluator keeps samples."""
        spans = [self.window_s, *(r.not_shrinking_s or 0.0 for r in self.rules)]
        return max(spans) + 2 * self.interval_s

    def watched(self) -> WatchedGroups:
        """The groups a snapshot reads: those with :attr:`group_prefix`, and every rule's."""
        return WatchedGroups(
            self.group_prefix, frozenset((group, rule.topic) for rule in self.rules for group in rule.groups)
        )


#: The process's lag monitor settings.
get_lag_settings: SettingsGetter[LagSettings] = cached_settings(LagSettings)
