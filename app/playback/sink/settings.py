"""Settings of the sink group (``AVCC_SINK_*``): batches, inserts and their backoff."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.settings import SettingsGetter, cached_settings

__all__ = ["SinkSettings", "get_sink_settings"]


class SinkSettings(BaseSettings):
    """Knobs of the sink. Each field maps to ``AVCC_SINK_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_SINK_", frozen=True, extra="ignore")

    batch_max_rows: int = Field(
        50_000, ge=1, description="Messages per batch (one insert per table); bounds memory."
    )
    batch_max_seconds: float = Field(
        1.0, gt=0, description="Longest time a message waits in a batch before the insert."
    )
    consume_chunk: int = Field(10_000, ge=1, description="Messages asked of one consume() call.")
    backoff_initial_s: float = Field(0.5, gt=0, description="First wait after a failed insert.")
    backoff_max_s: float = Field(15.0, gt=0, description="Cap of the insert retry backoff.")
    dlq_timeout_s: float = Field(30.0, gt=0, description="Wait for DLQ acknowledgements.")
    age_sample_every: int = Field(
        64, ge=1, description="Observe the event-age histogram for one row in N (cost control)."
    )
    gc_gen0_threshold: int = Field(
        50_000,
        ge=0,
        description="Gen-0 threshold of Python's GC set by a starting sink (process-wide; 0 keeps "
        "Python's 700). Batches allocate ~10 objects per event; frequent young collections cost "
        "~10% of the sink's CPU.",
    )


#: The process's sink settings.
get_sink_settings: SettingsGetter[SinkSettings] = cached_settings(SinkSettings)
