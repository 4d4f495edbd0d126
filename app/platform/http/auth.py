"""HMAC request authentication of every ``/v1/`` endpoint, and the JSON error responses of views.

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

Checks, in order (the first failure answers 401 ``{"error": ..., "reason": ...}``):
``missing_header`` (a header is absent or malformed), ``unknown_key``, ``stale_timestamp``
(further than ``settings.hmac_max_skew_ms`` from the server clock, either way), ``bad_signature``
(constant-time compare), ``replayed_nonce`` (the key already used this nonce; a nonce is only
recorded once its signature verified, so forged requests cannot poison the cache).

Views use :func:`require_hmac` (a decorator for faust ``View`` methods) or call
:func:`authenticate` themselves; clients, tests and the bench sign with :func:`sign_request`.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal

import orjson
from aiohttp import web

from app.platform.errors import AvccError
from app.platform.metrics import AUTH_FAILURES, HTTP_REQUESTS
from app.platform.settings import Settings, get_settings

__all__ = [
    "HEADER_KEY",
    "HEADER_NONCE",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "KEY_ID_ATTRIBUTE",
    "AuthFailureReason",
    "AuthenticationFailed",
    "NonceCache",
    "PayloadTooLarge",
    "authenticate",
    "authorize",
    "body_sha256",
    "canonical_request",
    "default_nonce_cache",
    "json_error",
    "json_response",
    "read_body",
    "require_hmac",
    "sign_request",
    "signature",
    "verify_headers",
]

log = logging.getLogger(__name__)

HEADER_KEY: Final = "X-AVCC-Key"
HEADER_TIMESTAMP: Final = "X-AVCC-Timestamp"
HEADER_NONCE: Final = "X-AVCC-Nonce"
HEADER_SIGNATURE: Final = "X-AVCC-Signature"
#: ``request[KEY_ID_ATTRIBUTE]`` holds the authenticated key id inside a :func:`require_hmac` view.
KEY_ID_ATTRIBUTE: Final = "avcc_key_id"

AuthFailureReason = Literal[
    "missing_header", "unknown_key", "stale_timestamp", "bad_signature", "replayed_nonce"
]

_NONCE_MIN: Final = 8
_NONCE_MAX: Final = 128
_HEX: Final = frozenset("0123456789abcdef")
#: Default bound of the per-process nonce cache (about 100 bytes per entry).
DEFAULT_NONCE_CAPACITY: Final = 500_000


class AuthenticationFailed(AvccError):
    """A ``/v1/`` request was refused (401). ``reason`` says which check failed.

    The client must sign with a configured key, a fresh nonce and a current timestamp
    (see the module docstring for the canonical request).
    """

    def __init__(self, reason: AuthFailureReason, message: str) -> None:
        super().__init__(message)
        self.reason: AuthFailureReason = reason
        self.message = message

    def response(self) -> web.Response:
        """The 401 JSON answer ``{"error": message, "reason": reason}``."""
        return json_error(401, self.message, reason=self.reason)


class PayloadTooLarge(AvccError):
    """The request body exceeds the endpoint's limit (413). Split the batch and resend."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than {limit} bytes")
        self.limit = limit

    def response(self) -> web.Response:
        """The 413 JSON answer."""
        return json_error(413, str(self), reason="body_too_large", limit_bytes=self.limit)


# --- JSON responses ---------------------------------------------------------------------------


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A JSON (orjson) response; usable as the return value of any faust/aiohttp view."""
    return web.Response(
        body=orjson.dumps(data),
        status=status,
        content_type="application/json",
        headers=dict(headers) if headers else None,
    )


def json_error(
    status: int,
    error: str,
    *,
    reason: str | None = None,
    retry_after_s: float | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    """An error answer ``{"error": error, "reason": reason, **extra}`` (400/401/413/429/...).

    ``retry_after_s`` sets ``Retry-After`` (whole seconds, at least 1) and ``retry_after_s`` in
    the body; use it for 429 and 503.
    """
    body: dict[str, Any] = {"error": error}
    if reason is not None:
        body["reason"] = reason
    all_headers = dict(headers) if headers else {}
    if retry_after_s is not None:
        seconds = max(1, int(retry_after_s + 0.999))
        all_headers["Retry-After"] = str(seconds)
        body["retry_after_s"] = seconds
    body.update(extra)
    return json_response(body, status, all_headers)


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
    """Per-process set of recently used ``(key, nonce)`` pairs, bounded in size and time.

    An entry lives ``ttl_ms`` (twice the skew window: a request is only accepted within
    ``+/- skew`` of the server clock, so after ``2 * skew`` its replay fails the timestamp check
    anyway). When the cache is full of live entries the oldest is evicted and its request
    timestamp becomes a *floor*: any later request signed at or before the floor is refused as
    stale, so an eviction can never re-open a replay. Thread-safe.
    """

    def __init__(self, ttl_ms: int, capacity: int = DEFAULT_NONCE_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.ttl_ms = ttl_ms
        self.capacity = capacity
        #: (key, nonce) -> (expiry ms, request timestamp ms), in insertion order.
        self._entries: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.floor_ms = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _purge(self, now_ms: int) -> None:
        entries = self._entries
        while entries:
            first = next(iter(entries))
            expiry, _ = entries[first]
            if expiry > now_ms:
                break
            del entries[first]

    def check_and_add(self, key: str, nonce: str, timestamp_ms: int, now_ms: int) -> AuthFailureReason | None:
        """Record the pair; return the refusal reason if it was seen (or is below the floor)."""
        with self._lock:
            self._purge(now_ms)
            if timestamp_ms <= self.floor_ms:
                return "stale_timestamp"
            pair = (key, nonce)
            if pair in self._entries:
                return "replayed_nonce"
            while len(self._entries) >= self.capacity:
                _, (_, evicted_ts) = self._entries.popitem(last=False)
                if evicted_ts > self.floor_ms:
                    self.floor_ms = evicted_ts
                    log.warning(
                        "nonce cache full (%d): refusing requests signed before %d", self.capacity, evicted_ts
                    )
            self._entries[pair] = (now_ms + self.ttl_ms, timestamp_ms)
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


# --- request side -----------------------------------------------------------------------------


async def read_body(request: Any, max_bytes: int) -> bytes:
    """The raw body of an aiohttp request, refusing (``PayloadTooLarge``) more than ``max_bytes``.

    Checks ``Content-Length`` first, then counts while streaming (chunked bodies), so a huge
    body is never buffered. Reads the body once: pass the result on (e.g. to
    :func:`authenticate`) instead of reading again.
    """
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise PayloadTooLarge(max_bytes)
    chunks: list[bytes] = []
    size = 0
    stream = request.content
    while True:
        chunk = await stream.readany()
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _fail(reason: AuthFailureReason, message: str) -> AuthenticationFailed:
    AUTH_FAILURES.labels(reason).inc()
    return AuthenticationFailed(reason, message)


def verify_headers(
    method: str,
    path_qs: str,
    headers: Mapping[str, str],
    body: bytes,
    settings: Settings,
    *,
    nonces: NonceCache | None = None,
    now_ms: int | None = None,
    check_nonce: bool = True,
) -> str:
    """Framework-free core of :func:`authenticate`: the key id, or raise ``AuthenticationFailed``.

    ``check_nonce=False`` skips the replay check (only for a request a peer worker already
    authenticated and forwarded: that worker recorded the nonce).
    """
    values: dict[str, str] = {}
    for name in (HEADER_KEY, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE):
        value = headers.get(name)
        if not value:
            raise _fail("missing_header", f"missing header {name}")
        values[name] = value
    key_id, ts_text, nonce, given = (
        values[HEADER_KEY],
        values[HEADER_TIMESTAMP],
        values[HEADER_NONCE],
        values[HEADER_SIGNATURE],
    )
    if not (ts_text.isascii() and ts_text.isdigit() and len(ts_text) <= 16):
        raise _fail("missing_header", f"{HEADER_TIMESTAMP} must be unix milliseconds (decimal digits)")
    nonce_ok = _NONCE_MIN <= len(nonce) <= _NONCE_MAX and nonce.isascii() and nonce.isprintable()
    if not nonce_ok or " " in nonce:
        raise _fail(
            "missing_header", f"{HEADER_NONCE} must be {_NONCE_MIN}-{_NONCE_MAX} printable ASCII characters"
        )
    secret = settings.effective_hmac_keys().get(key_id)
    if secret is None:
        raise _fail("unknown_key", "unknown API key")
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    timestamp = int(ts_text)
    skew = settings.hmac_max_skew_ms
    if abs(now - timestamp) > skew:
        raise _fail("stale_timestamp", f"timestamp is more than {skew} ms away from the server clock")
    expected = signature(secret, method, path_qs, ts_text, nonce, body)
    given_lower = given.lower()
    if len(given_lower) != len(expected) or not set(given_lower) <= _HEX:
        raise _fail("bad_signature", "signature must be 64 hex digits of HMAC-SHA256")
    if not hmac.compare_digest(expected, given_lower):
        raise _fail("bad_signature", "signature does not match the request")
    if not check_nonce:
        return key_id
    cache = nonces if nonces is not None else default_nonce_cache(settings)
    refused = cache.check_and_add(key_id, nonce, timestamp, now)
    if refused == "replayed_nonce":
        raise _fail("replayed_nonce", "nonce already used")
    if refused is not None:
        raise _fail(refused, "request signed too long ago to be checked for replay; sign it again")
    return key_id


async def authenticate(
    request: Any,
    settings: Settings,
    *,
    body: bytes | None = None,
    nonces: NonceCache | None = None,
) -> str:
    """Verify the HMAC headers of an aiohttp/faust request; return the key id.

    ``body`` is the raw body when the caller already read it (e.g. with :func:`read_body`);
    otherwise it is read here (aiohttp's own limit, 1 MiB, applies). Raises
    ``AuthenticationFailed`` (answer it with ``exc.response()``).
    """
    raw = body if body is not None else await request.read()
    return verify_headers(
        str(request.method), str(request.path_qs), request.headers, raw, settings, nonces=nonces
    )


async def authorize(
    request: Any,
    body: bytes,
    settings: Settings,
    *,
    route: str = "",
    forwarded: bool = False,
    nonces: NonceCache | None = None,
) -> web.Response | None:
    """``None`` when the request is authentic, else the 401 answer to return as is.

    The one-liner for views that read the body themselves::

        denied = await authorize(request, body, settings, route=ROUTE)
        if denied is not None:
            return denied

    ``forwarded`` (a request relayed by the peer worker that owns a partition, already
    authenticated there) skips the nonce check; the signature and timestamp are still verified.
    With ``route`` the refusal is counted in ``avcc_http_requests_total``.
    """
    try:
        request[KEY_ID_ATTRIBUTE] = verify_headers(
            str(request.method),
            str(request.path_qs),
            request.headers,
            body,
            settings,
            nonces=nonces,
            check_nonce=not forwarded,
        )
    except AuthenticationFailed as exc:
        if route:
            HTTP_REQUESTS.labels(route, str(request.method), "401").inc()
        return exc.response()
    return None


_Handler = Callable[..., Awaitable[Any]]


def require_hmac(handler: _Handler) -> _Handler:
    """Decorate a faust ``View`` method (``async def post(self, request)``) with HMAC auth.

    Refused requests get the 401 JSON answer (a body above aiohttp's 1 MiB limit: 413). Inside
    the handler ``request[KEY_ID_ATTRIBUTE]`` is the key id and ``await request.read()`` returns
    the (cached) body. Views with bigger bodies call :func:`read_body` and :func:`authenticate`
    themselves.
    """

    @functools.wraps(handler)
    async def wrapper(view: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            key_id = await authenticate(request, get_settings())
        except AuthenticationFailed as exc:
            return exc.response()
        except web.HTTPRequestEntityTooLarge as exc:
            return json_error(413, f"request body too large: {exc.text}", reason="body_too_large")
        request[KEY_ID_ATTRIBUTE] = key_id
        return await handler(view, request, *args, **kwargs)

    return wrapper
