"""Signed calls from the console to the review, code and sink workers' ``/v1/`` routes.

The console is a partner of the other groups, not a reader of their tables: it signs with the
key of :meth:`ConsoleSettings.signing_key`, so every check those routes make (signature, scope,
nonce) applies to it too.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from app.ops.console.settings import ConsoleSettings
from app.platform.http.signing import sign_request
from app.platform.settings import Settings

__all__ = ["PeerError", "Peers"]


class PeerError(RuntimeError):
    """A worker could not be reached, or refused the console's request."""


class Peers:
    """Signed JSON requests to other groups' workers."""

    def __init__(self, settings: Settings, config: ConsoleSettings) -> None:
        self.settings = settings
        self.config = config

    @property
    def key_id(self) -> str | None:
        """The console's API key id (``None`` when none is configured)."""
        key = self.config.signing_key(self.settings)
        return key[0] if key else None

    async def call(self, group: str, method: str, path_qs: str, body: Any = None) -> tuple[int, Any]:
        """``(status, decoded JSON)`` of one signed request to ``group``'s worker."""
        key = self.config.signing_key(self.settings)
        if key is None:
            raise PeerError("no console API key: set AVCC_CONSOLE_KEY_ID to a key of AVCC_HMAC_KEYS")
        data = orjson.dumps(body) if body is not None else b""
        headers = sign_request(method, path_qs, data, key[0], key[1])
        if body is not None:
            headers["Content-Type"] = "application/json"
        url = self.config.peer_url(self.settings, group) + path_qs
        timeout = aiohttp.ClientTimeout(total=self.config.peer_timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.request(method, url, data=data, headers=headers) as response,
            ):
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            base = self.config.peer_url(self.settings, group)
            raise PeerError(f"{group} worker at {base} unreachable ({type(exc).__name__})") from exc
        try:
            return status, orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError as exc:
            raise PeerError(f"{group} worker answered {status} with non-JSON") from exc

    async def get_ok(self, group: str, path_qs: str) -> Any:
        """The JSON body of a ``GET`` that must answer 200."""
        status, body = await self.call(group, "GET", path_qs)
        if status != 200:
            raise PeerError(f"{group} worker answered {status}: {body}")
        return body
