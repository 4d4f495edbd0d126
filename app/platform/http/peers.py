"""Calls between the workers of the pipeline (not partner requests), signed by a peer key.

A worker that needs another worker's partition to act (the code group's claims: only the owner
of a claims partition processes its claims) calls that worker directly. Such a call carries
``X-AVCC-Peer-Timestamp`` (unix ms) and ``X-AVCC-Peer``: the HMAC-SHA256 of
``METHOD\\nPATH\\nTIMESTAMP\\nhex(sha256(body))`` under a key derived from every configured
partner secret (:func:`peer_key`), which every worker of the deployment holds and no partner
can derive alone. A call older or newer than :data:`PEER_WINDOW_MS` is refused; the calls it
carries are idempotent, so a replay within the window changes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from typing import Any, Final

import aiohttp

from app.platform.settings import Settings

__all__ = [
    "PEER_HEADER",
    "PEER_TIMESTAMP_HEADER",
    "PEER_WINDOW_MS",
    "PeerClient",
    "is_peer_call",
    "peer_headers",
    "peer_key",
]

PEER_HEADER: Final = "X-AVCC-Peer"
PEER_TIMESTAMP_HEADER: Final = "X-AVCC-Peer-Timestamp"
#: How far a peer call's timestamp may be from this worker's clock.
PEER_WINDOW_MS: Final = 5 * 60 * 1000


def peer_key(settings: Settings) -> bytes:
    """The key peer calls are signed with (derived from every configured partner secret)."""
    secrets = "\n".join(sorted(settings.effective_hmac_keys().values())).encode()
    return hmac.new(secrets, b"avcc peer calls", hashlib.sha256).digest()


def _signature(key: bytes, method: str, path: str, timestamp_ms: int, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    message = f"{method.upper()}\n{path}\n{timestamp_ms}\n{digest}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def peer_headers(settings: Settings, method: str, path: str, body: bytes) -> dict[str, str]:
    """The headers that make ``method path`` with ``body`` a peer call."""
    now = time.time_ns() // 1_000_000
    return {
        PEER_TIMESTAMP_HEADER: str(now),
        PEER_HEADER: _signature(peer_key(settings), method, path, now, body),
        "Content-Type": "application/json",
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
    wanted = _signature(peer_key(settings), str(request.method), str(request.path), timestamp_ms, body)
    return hmac.compare_digest(wanted, given)


class PeerClient:
    """One keep-alive HTTP session for this worker's peer calls (opened on first use)."""

    def __init__(self, settings: Settings, timeout_s: float) -> None:
        self.settings = settings
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()

    async def _open(self) -> aiohttp.ClientSession:
        async with self._lock:
            if self._session is None or self._session.closed:
                self._session = aiohttp.ClientSession(timeout=self.timeout)
            return self._session

    async def post(self, base_url: str, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` to ``path`` of the worker at ``base_url``: its status and body. Raises
        ``aiohttp.ClientError`` / ``TimeoutError`` when it cannot be reached."""
        session = await self._open()
        headers = peer_headers(self.settings, "POST", path, body)
        async with session.post(base_url.rstrip("/") + path, data=body, headers=headers) as response:
            return response.status, await response.read()

    async def close(self) -> None:
        """Close the session (at worker stop)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
