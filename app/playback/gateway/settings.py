"""Settings of the gateway group (``AVCC_GATEWAY_*``): the limits of a playback batch."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.settings import SettingsGetter, cached_settings

__all__ = ["GatewaySettings", "get_gateway_settings"]


class GatewaySettings(BaseSettings):
    """Limits of the playback gateway. Each field maps to ``AVCC_GATEWAY_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_GATEWAY_", frozen=True, extra="ignore")

    max_items: int = Field(default=5_000, ge=1, description="Most items per batch (more: 413).")
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="Largest request body in bytes (more: 413)."
    )
    max_queue: int = Field(
        default=100_000,
        ge=1,
        description="Producer queue depth (messages) above which batches get 429; keep it below "
        "the playback profile's queue.buffering.max.messages (200k).",
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After of a 429 answer.")


#: The process's gateway settings.
get_gateway_settings: SettingsGetter[GatewaySettings] = cached_settings(GatewaySettings)
