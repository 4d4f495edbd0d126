"""Console settings (``AVCC_CONSOLE_*``): how the ops worker reaches the review, code and sink workers.

The console never reads another group's table directly: it calls their signed ``/v1/`` routes
like any partner, with the API key named by ``AVCC_CONSOLE_KEY_ID`` (an entry of
``AVCC_HMAC_KEYS`` with the scopes ``review:decide``, ``records:read`` and ``playback:read``;
the shipped ``dev`` key in dev mode). A decision made from the workbench therefore records the
operator as ``reviewer`` and this key as ``decided_by_key``.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.groups import group_spec
from app.platform.settings import DEV_HMAC_KEYS, Settings, SettingsGetter, cached_settings

__all__ = ["ConsoleSettings", "get_console_settings"]


def _local_host(settings: Settings) -> str:
    """Where the local stack's workers answer: ``AVCC_WEB_HOST``, loopback for a wildcard."""
    return settings.web_host if settings.web_host not in {"0.0.0.0", "::", ""} else "127.0.0.1"


class ConsoleSettings(BaseSettings):
    """Where the console's peers are and which key it signs with."""

    model_config = SettingsConfigDict(env_prefix="AVCC_CONSOLE_", frozen=True, extra="ignore")

    key_id: str = Field(
        "",
        description="API key (an `AVCC_HMAC_KEYS` id with scopes review:decide, records:read, "
        "playback:read) the console signs its calls to other workers with; empty: `dev` in dev mode, "
        "else the workbench and record counts are unavailable.",
    )
    review_url: str = Field("", description="Base URL of a review worker; empty: `AVCC_WEB_HOST` + its port.")
    code_url: str = Field(
        "",
        description="Base URL of any code replica (each answers records by status for every "
        "replica); when it does not answer, the replicas its last answer named are asked. Empty: "
        "`AVCC_WEB_HOST` + its port.",
    )
    sink_url: str = Field("", description="Base URL of a sink worker; empty: `AVCC_WEB_HOST` + its port.")
    workers_host: str = Field(
        "",
        description="Host name whose addresses are the workers of a group with local state, "
        "`{group}` replaced by its name, for the overview's readiness of every worker: in Kubernetes "
        "the group's headless Service (`avcc-{group}-peers.avcc.svc`). Empty: `AVCC_WEB_HOST`.",
    )
    peer_timeout_s: float = Field(5.0, description="Time limit of one call to another worker.")
    form_token_ttl_s: int = Field(3600, description="How long a workbench form's CSRF token stays valid.")

    def peer_url(self, settings: Settings, group: str) -> str:
        """The configured base URL of ``group``'s worker, or the local stack's default."""
        configured = {"review": self.review_url, "code": self.code_url, "sink": self.sink_url}.get(group, "")
        if configured:
            return configured.rstrip("/")
        return f"http://{_local_host(settings)}:{settings.web_port + group_spec(group).port_offset}"

    def group_host(self, settings: Settings, group: str) -> str:
        """The host name whose addresses are ``group``'s workers."""
        return self.workers_host.format(group=group) if self.workers_host else _local_host(settings)

    def signing_key(self, settings: Settings) -> tuple[str, str] | None:
        """``(key id, secret)`` the console signs with, or ``None`` when none is configured."""
        keys = settings.effective_hmac_keys()
        key_id = self.key_id or (next(iter(DEV_HMAC_KEYS)) if settings.dev_mode else "")
        if key_id and key_id in keys:
            return key_id, keys[key_id]
        return None


#: The process's console settings.
get_console_settings: SettingsGetter[ConsoleSettings] = cached_settings(ConsoleSettings)
