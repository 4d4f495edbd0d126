"""Signed calls from the console to the review, code and sink workers' ``/v1/`` routes.

The console is a partner of the other groups, not a peer and not a reader of their tables: it
signs with the key of :meth:`ConsoleSettings.signing_key`, so every check those routes make
(signature, scope, nonce) applies to it too, and a decision records that key. Its calls go
through the one client of calls between workers (:class:`~app.platform.http.peers.PeerCalls`),
carrying the partner signature instead of a peer one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.ops.console.settings import ConsoleSettings
from app.platform.http.peers import PeerCalls, PeerError
from app.platform.http.signing import sign_request
from app.platform.settings import Settings

__all__ = ["PartnerRoutes", "PeerError", "Peers"]


@dataclass(frozen=True, slots=True)
class PartnerRoutes:
    """The paths of the other groups' ``/v1/`` routes the console calls. Their declarations stand
    above the domains (:mod:`app.api`): the ops group's wiring hands them over."""

    #: ``GET`` the review tasks (the workbench's page).
    tasks: str
    #: ``POST`` a reviewer's decision, with ``{avcc_record_id}``.
    decide: str
    #: ``GET`` the records by status of every code replica.
    record_counts: str
    #: ``GET`` the time to code of every code replica.
    time_to_code: str
    #: ``GET`` the playback anomalies.
    anomalies: str


class Peers:
    """Signed JSON requests to other groups' workers."""

    def __init__(self, settings: Settings, config: ConsoleSettings) -> None:
        self.settings = settings
        self.config = config
        self.calls = PeerCalls(settings, config.peer_timeout_s)

    @property
    def key_id(self) -> str | None:
        """The console's API key id (``None`` when none is configured)."""
        key = self.config.signing_key(self.settings)
        return key[0] if key else None

    async def call(
        self, group: str, method: str, path_qs: str, body: Any = None, *, base: str | None = None
    ) -> tuple[int, Any]:
        """``(status, decoded JSON)`` of one signed request to ``group``'s worker (the configured
        one, or the replica at ``base``)."""
        key = self.config.signing_key(self.settings)
        if key is None:
            raise PeerError("no console API key: set AVCC_CONSOLE_KEY_ID to a key of AVCC_HMAC_KEYS")
        data = orjson.dumps(body) if body is not None else b""
        headers = sign_request(method, path_qs, data, key[0], key[1])
        if body is not None:
            headers["Content-Type"] = "application/json"
        base = (base or self.config.peer_url(self.settings, group)).rstrip("/")
        try:
            reply = await self.calls.request(base, method, path_qs, data, headers=headers, peer=False)
        except PeerError as exc:
            raise PeerError(f"{group} worker at {base} unreachable ({exc})") from exc
        try:
            return reply.status, orjson.loads(reply.body) if reply.body else None
        except orjson.JSONDecodeError as exc:
            raise PeerError(f"{group} worker answered {reply.status} with non-JSON") from exc

    async def get_ok(self, group: str, path_qs: str, *, base: str | None = None) -> Any:
        """The JSON body of a ``GET`` that must answer 200."""
        status, body = await self.call(group, "GET", path_qs, base=base)
        if status != 200:
            raise PeerError(f"{group} worker answered {status}: {body}")
        return body

    async def get_from_any(self, group: str, path_qs: str, replicas: Sequence[str]) -> Any:
        """The JSON body of a ``GET`` answered 200 by the configured worker of ``group`` or, when
        it does not, by the first of ``replicas`` (other base URLs of the group) that does."""
        failures: list[str] = []
        for base in [None, *replicas]:
            try:
                return await self.get_ok(group, path_qs, base=base)
            except PeerError as exc:
                failures.append(str(exc))
        raise PeerError("; ".join(failures))
