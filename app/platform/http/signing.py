"""Request signing of the ``/v1/`` API: the canonical request, its HMAC, and replay protection.

A partner signs each request with a shared secret::

    X-AVCC-Key:        key id (a name of ``settings.effective_hmac_keys()``)
    X-AVCC-Timestamp:  unix time in milliseconds (decimal)
    X-AVCC-Nonce:      8-128 printable ASCII characters, never reused within the skew window
    X-AVCC-Signature:  lowercase hex HMAC-SHA256(secret, canonical request)

The canonical request is five lines joined by ``\\n`` (no trailing newline)::

    METHOD            upper case, e.g. POST
    PATH_QS           the path plus "?" and the query string when there is one, exactly as sent
                      (aiohttp's ``request.path_qs``); e.g. /v1/playback/events?dry=1
    TIMESTAMP         the X-AVCC-Timestamp header value
    NONCE             the X-AVCC-Nonce header value
    BODY_SHA256       lowercase hex sha256 of the raw body bytes (of b"" when there is no body)

Clients, tests and the bench sign with :func:`sign_request`; workers check requests with
:mod:`app.platform.http.auth`, which remembers used nonces in a :class:`NonceCache`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from typing import Final, Literal

from app.platform.settings import Settings

__all__ = [
    "DEFAULT_NONCE_CAPACITY",
    "HEADER_KEY",
    "HEADER_NONCE",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "NONCE_MAX",
    "NONCE_MIN",
    "AuthFailureReason",
    "NonceCache",
    "body_sha256",
    "canonical_request",
    "default_nonce_cache",
    "sign_request",
    "signature",
]

log = logging.getLogger(__name__)

HEADER_KEY: Final = "X-AVCC-Key"
HEADER_TIMESTAMP: Final = "X-AVCC-Timestamp"
HEADER_NONCE: Final = "X-AVCC-Nonce"
HEADER_SIGNATURE: Final = "X-AVCC-Signature"

AuthFailureReason = Literal[
    "missing_header", "unknown_key", "stale_timestamp", "bad_signature", "replayed_nonce"
]

NONCE_MIN: Final = 8
NONCE_MAX: Final = 128
#: Default bound of live nonces per key (about 100 bytes per entry): 200 signed requests a
#: second for the whole 10-minute window.
DEFAULT_NONCE_CAPACITY: Final = 120_000


# --- signing ----------------------------------------------------------------------------------


def body_sha256(body: bytes) -> str:
    """Lowercase hex sha256 of the raw body."""
    return hashlib.sha256(body).hexdigest()


def canonical_request(method: str, path_qs: str, timestamp_ms: str, nonce: str, body: bytes) -> bytes:
    """The bytes that are signed (see the module docstring)."""
    text = f"{method.upper()}\n{path_qs}\n{timestamp_ms}\n{nonce}\n{body_sha256(body)}"
    return text.encode()


def signature(secret: str, method: str, path_qs: str, timestamp_ms: str, nonce: str, body: bytes) -> str:
    """Lowercase hex HMAC-SHA256 of the canonical request."""
    message = canonical_request(method, path_qs, timestamp_ms, nonce, body)
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign_request(
    method: str,
    path_qs: str,
    body: bytes,
    key: str,
    secret: str,
    timestamp_ms: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The four ``X-AVCC-*`` headers of a request (fresh nonce and the current time by default).

    ``path_qs`` is the path plus ``?query`` when there is a query string, exactly as sent.
    """
    ts = str(timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000)
    nonce = nonce if nonce is not None else secrets.token_hex(16)
    return {
        HEADER_KEY: key,
        HEADER_TIMESTAMP: ts,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: signature(secret, method, path_qs, ts, nonce, body),
    }


# --- replay protection ------------------------------------------------------------------------


class NonceCache:
    """Recently used nonces of each key, bounded in size and time, one key never crowding another.

    An entry lives ``ttl_ms`` (twice the skew window: a request is only accepted within
    ``+/- skew`` of the server clock, so after ``2 * skew`` its replay fails the timestamp check
    anyway). Each key holds at most ``capacity`` live entries; when a key's entries are full its
    oldest is evicted and that request's timestamp becomes the key's *floor*: any later request
    of the same key signed at or before the floor is refused as stale, so an eviction never
    re-opens a replay, and a key that floods the cache (e.g. with timestamps in the future)
    only ever refuses its own requests. Thread-safe.
    """

    def __init__(self, ttl_ms: int, capacity: int = DEFAULT_NONCE_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.ttl_ms = ttl_ms
        self.capacity = capacity
        #: key -> nonce -> (expiry ms, request timestamp ms), each in insertion order.
        self._entries: dict[str, OrderedDict[str, tuple[int, int]]] = {}
        self._floors: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._entries.values())

    def floor_ms(self, key: str) -> int:
        """Requests of ``key`` signed at or before this time are refused (0: none)."""
        return self._floors.get(key, 0)

    def contains(self, key: str, nonce: str, now_ms: int) -> bool:
        """Whether ``nonce`` of ``key`` is recorded and still live."""
        with self._lock:
            entries = self._entries.get(key)
            entry = entries.get(nonce) if entries is not None else None
            return entry is not None and entry[0] > now_ms

    def _purge(self, entries: OrderedDict[str, tuple[int, int]], now_ms: int) -> None:
        while entries:
            first = next(iter(entries))
            if entries[first][0] > now_ms:
                break
            del entries[first]

    def check_and_add(self, key: str, nonce: str, timestamp_ms: int, now_ms: int) -> AuthFailureReason | None:
        """Record the pair; return the refusal reason if it was seen (or is below the key's floor)."""
        with self._lock:
            entries = self._entries.setdefault(key, OrderedDict())
            self._purge(entries, now_ms)
            if timestamp_ms <= self._floors.get(key, 0):
                return "stale_timestamp"
            if nonce in entries:
                return "replayed_nonce"
            while len(entries) >= self.capacity:
                _, (_, evicted_ts) = entries.popitem(last=False)
                if evicted_ts > self._floors.get(key, 0):
                    self._floors[key] = evicted_ts
                    log.warning(
                        "nonce cache of key %r full (%d): refusing its requests signed before %d",
                        key,
                        self.capacity,
                        evicted_ts,
                    )
            entries[nonce] = (now_ms + self.ttl_ms, timestamp_ms)
            return None


_default_caches: dict[int, NonceCache] = {}
_default_lock = threading.Lock()


def default_nonce_cache(settings: Settings) -> NonceCache:
    """The process-wide nonce cache for ``settings.hmac_max_skew_ms`` (created on first use)."""
    ttl = 2 * settings.hmac_max_skew_ms
    with _default_lock:
        cache = _default_caches.get(ttl)
        if cache is None:
            cache = _default_caches[ttl] = NonceCache(ttl)
        return cache
