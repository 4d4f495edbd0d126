"""API keys with scopes, and the rule that refuses placeholder or empty secrets.

``AVCC_HMAC_KEYS`` maps a key id to either a bare secret (every scope: the original format,
kept for compatibility) or ``{"secret": "...", "scopes": ["playback:write", ...]}``. A request
signed with a key may only use the routes its scopes name (403 ``reason: scope`` otherwise).
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = ["ALL_SCOPES", "ApiKey", "Scope", "refuse_weak_secret"]

#: What a key may do: one scope per kind of route.
Scope = Literal[
    "apply",  # POST /v1/avcc/applications
    "records:read",  # GET /v1/avcc/records/{id}
    "review:decide",  # GET /v1/review/tasks, POST /v1/review/tasks/{id}/decision
    "settlement",  # POST and GET /v1/settlement/instructions
    "playback:write",  # POST /v1/playback/events
    "playback:read",  # GET /v1/playback/stats, /v1/playback/anomalies
]
ALL_SCOPES: Final[frozenset[Scope]] = frozenset(get_args(Scope))

#: Secrets copied from an example: a deployment that kept one would be open to anyone reading it.
_PLACEHOLDERS: Final = ("change-me", "changeme", "<secret>", "<password>")


def refuse_weak_secret(owner: str, value: str) -> None:
    """Raise ``ValueError`` for an empty (or blank) secret or an example placeholder."""
    if not value.strip():
        raise ValueError(f"{owner}: the secret is empty")
    lowered = value.lower()
    if any(marker in lowered for marker in _PLACEHOLDERS):
        raise ValueError(f"{owner}: the secret is the example placeholder; set a real one")


class ApiKey(BaseModel):
    """One partner key: its HMAC secret and the scopes it may use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    secret: SecretStr
    scopes: frozenset[Scope] = Field(default=ALL_SCOPES)

    @field_validator("scopes")
    @classmethod
    def _some_scope(cls, scopes: frozenset[Scope]) -> frozenset[Scope]:
        if not scopes:
            raise ValueError("a key needs at least one scope")
        return scopes

    def allows(self, scope: Scope) -> bool:
        """Whether requests signed with this key may use a route of ``scope``."""
        return scope in self.scopes
