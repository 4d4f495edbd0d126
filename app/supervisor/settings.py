"""Settings of the dev stack's supervisor (``AVCC_DEV_*``): how crashed groups are restarted."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.settings import SettingsGetter, cached_settings
from app.supervisor.backoff import BackoffPolicy

__all__ = ["SupervisorSettings", "get_supervisor_settings"]


class SupervisorSettings(BaseSettings):
    """Restart backoff of ``avcc dev`` (Kubernetes applies its own to pods: 10 s doubling to 5 min)."""

    model_config = SettingsConfigDict(env_prefix="AVCC_DEV_", frozen=True, extra="ignore")

    restart_initial_s: float = Field(
        1.0, ge=0, description="`avcc dev`: delay before restarting a group that exited (doubles per crash)."
    )
    restart_max_s: float = Field(60.0, gt=0, description="`avcc dev`: longest delay between restarts.")
    restart_stable_s: float = Field(
        120.0,
        gt=0,
        description="`avcc dev`: a group that ran this long before exiting starts again at the "
        "initial delay.",
    )
    crash_loop_restarts: int = Field(
        5,
        ge=1,
        description="`avcc dev`: consecutive crashes after which a group is reported as crash-looping "
        "(it is still restarted).",
    )

    def policy(self) -> BackoffPolicy:
        """The backoff policy these settings describe."""
        return BackoffPolicy(
            initial_s=self.restart_initial_s,
            max_s=max(self.restart_max_s, self.restart_initial_s),
            stable_s=self.restart_stable_s,
            crash_loop_after=self.crash_loop_restarts,
        )


#: The process's supervisor settings.
get_supervisor_settings: SettingsGetter[SupervisorSettings] = cached_settings(SupervisorSettings)
