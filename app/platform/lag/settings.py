"""How every worker reads consumer lag (``AVCC_LAG_*``): the offsets reader's time limit and the
period of each worker's own lag export. The ops group's alert rules are :mod:`app.ops.lag.settings`."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.settings import SettingsGetter, cached_settings

__all__ = ["LagReadSettings", "get_lag_read_settings"]


class LagReadSettings(BaseSettings):
    """The offsets reader's request time limit and the worker lag export's period."""

    model_config = SettingsConfigDict(env_prefix="AVCC_LAG_", frozen=True, extra="ignore")

    request_timeout_s: float = Field(10.0, description="Timeout of each admin/offset request.")
    export_interval_s: float = Field(
        10.0, description="How often every worker exports the lag of its own partitions."
    )


#: The process's lag read settings.
get_lag_read_settings: SettingsGetter[LagReadSettings] = cached_settings(LagReadSettings)
