"""Calls between the workers of the pipeline: the one way a worker trusts another, and the one
HTTP client every call to another worker goes through.

**Trust.** A call from one worker to another (a request forwarded to the owner of its record's
partition, a listing asked of every replica, a claim asked of the owner of a claims partition)
carries ``X-AVCC-Peer-Timestamp`` (unix ms) and ``X-AVCC-Peer``: the HMAC-SHA256 of
``METHOD\\nPATH_QS\\nTIMESTAMP\\nhex(sha256(body))`` under a key derived from every configured
partner secret (:func:`peer_key`), which every worker of the deployment holds and no partner can
derive alone. A call older or newer than :data:`PEER_WINDOW_MS` is refused; the calls it carries
are idempotent (a forwarded request's nonce is claimed where it is answered), so a replay within
the window changes nothing. The operator console is not a peer: it calls the workers' ``/v1/``
routes as a partner, with the key ``AVCC_CONSOLE_KEY_ID`` names (its scopes bound what it may do,
and a decision records that key), through the same client.

**Calls.** :class:`PeerCalls` keeps one keep-alive session (opened in the worker's event loop on
first use); a worker that cannot be reached within the call's time limit raises
:class:`PeerUnreachable`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from multidict import CIMultiDictProxy

from app.platform.errors import AvccError
from app.platform.settings import Settings

__all__ = [
    "PEER_HEADER",
    "PEER_TIMESTAMP_HEADER",
    "PEER_WINDOW_MS",
    "PeerCalls",
    "PeerError",
    "PeerReply",
    "PeerUnreachable",
    "is_peer_call",
    "peer_headers",
    "peer_key",
]

PEER_HEADER: Final = "X-AVCC-Peer"
PEER_TIMESTAMP_HEADER: Final = "X-AVCC-Peer-Timestamp"
#: How far a peer call's timestamp may be from this worker's clock.
PEER_WINDOW_MS: Final = 5 * 60 * 1000


class PeerError(AvccError):
    """Another worker could not be reached, or refused a call: retry once the group settles."""


class PeerUnreachable(PeerError):
    """Another worker did not answer within the call's time limit (killed, hung, restarting)."""


def peer_key(settings: Settings) -> bytes:
    """The key peer calls are signed with (derived from every configured partner secret)."""
    secrets = "\n".join(sorted(settings.effective_hmac_keys().values())).encode()
    return hmac.new(secrets, b"avcc peer calls", hashlib.sha256).digest()


def _signature(key: bytes, method: str, path_qs: str, timestamp_ms: int, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    message = f"{method.upper()}\n{path_qs}\n{timestamp_ms}\n{digest}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def peer_headers(settings: Settings, method: str, path_qs: str, body: bytes) -> dict[str, str]:
    """The headers that make ``method path_qs`` with ``body`` a peer call."""
    now = time.time_ns() // 1_000_000
    return {
        PEER_TIMESTAMP_HEADER: str(now),
        PEER_HEADER: _signature(peer_key(settings), method, path_qs, now, body),
    }


def is_peer_call(request: Any, body: bytes, settings: Settings) -> bool:
    """Whether ``request`` (with ``body``) is a peer call signed within the window."""
    stamp = request.headers.get(PEER_TIMESTAMP_HEADER, "")
    given = request.headers.get(PEER_HEADER, "")
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 16 and given):
        return False
    timestamp_ms = int(stamp)
    if abs(time.time_ns() // 1_000_000 - timestamp_ms) > PEER_WINDOW_MS:
        return False
    wanted = _signature(peer_key(settings), str(request.method), str(request.path_qs), timestamp_ms, body)
    return hmac.compare_digest(wanted, given)


@dataclass(frozen=True, slots=True)
class PeerReply:
    """What another worker answered: its status, headers and body."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes


class PeerCalls:
    """The HTTP client of every call to another worker: one keep-alive session per event loop,
    a time limit per call; peer calls are signed (:func:`peer_headers`), others carry the
    headers they are given (the console's partner signature)."""

    def __init__(self, settings: Settings, timeout_s: float) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _open(self) -> aiohttp.ClientSession:
        """The session of the running event loop (a new one in another loop)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session, self._loop = aiohttp.ClientSession(), loop
        return self._session

    async def request(
        self,
        base_url: str,
        method: str,
        path_qs: str,
        body: bytes = b"",
        *,
        headers: Mapping[str, str] | None = None,
        peer: bool = True,
        timeout_s: float | None = None,
    ) -> PeerReply:
        """``method path_qs`` with ``body`` at the worker at ``base_url``: its answer.

        ``peer`` signs it as a peer call; ``headers`` go along as they are. Raises
        :class:`PeerUnreachable` when the worker does not answer within the time limit.
        """
        sent = dict(headers or {})
        if peer:
            sent.update(peer_headers(self.settings, method, path_qs, body))
        limit = aiohttp.ClientTimeout(total=self.timeout_s if timeout_s is None else timeout_s)
        url = base_url.rstrip("/") + path_qs
        try:
            async with self._open().request(method, url, data=body, headers=sent, timeout=limit) as response:
                return PeerReply(response.status, response.headers, await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PeerUnreachable(f"{base_url} unreachable ({type(exc).__name__})") from exc

    async def close(self) -> None:
        """Close the session (at worker stop)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()
