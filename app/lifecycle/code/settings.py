"""Settings of the code group (``AVCC_BULK_*``): the limits of the bulk applications route."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.lifecycle.code.claims import CLAIM_SLOTS
from app.platform.settings import SettingsGetter, cached_settings

__all__ = ["BulkSettings", "get_bulk_settings"]


class BulkSettings(BaseSettings):
    """Limits of the bulk route of the code group. Each field maps to ``AVCC_BULK_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_BULK_", frozen=True, extra="ignore")

    max_items: int = Field(
        default=1_000, ge=1, le=CLAIM_SLOTS, description="Most applications per batch (more: 413)."
    )
    max_body_bytes: int = Field(
        default=2 * 1024 * 1024, ge=1024, description="Largest batch body in bytes (more: 413)."
    )
    max_in_flight: int = Field(
        default=4_000,
        ge=1,
        description="Applications a code worker holds in claims at once; a batch that does not fit "
        "is answered 429 with Retry-After.",
    )
    ask_timeout_s: float = Field(
        default=60.0, gt=0, description="Longest a claim is waited for at all; then its slot is freed."
    )
    claim_wait_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest a batch waits for its claims; items not answered by then are "
        "answered 429 (throttled) instead of timing out.",
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After of a 429 batch answer.")


#: The process's bulk route settings.
get_bulk_settings: SettingsGetter[BulkSettings] = cached_settings(BulkSettings)
