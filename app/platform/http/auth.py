"""HMAC request authentication of every ``/v1/`` endpoint (see :mod:`app.platform.http.signing`).

Checks, in order (the first failure answers 401 ``{"error": ..., "reason": ...}``):
``missing_header`` (a header is absent or malformed), ``unknown_key``, ``stale_timestamp``
(further than ``settings.hmac_max_skew_ms`` from the server clock, either way), ``bad_signature``
(constant-time compare), ``replayed_nonce`` (the key already used this nonce; a nonce is only
recorded once its signature verified, so forged requests cannot poison the cache).

Views use :func:`require_hmac` (a decorator for faust ``View`` methods), :func:`authorize` (the
401 answer or ``None``) or call :func:`authenticate` themselves. The signing side (headers,
canonical request, :func:`sign_request`, :class:`NonceCache`) lives in
:mod:`app.platform.http.signing` and is re-exported here for the callers that import it from auth.
"""

from __future__ import annotations

import functools
import hmac
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web

from app.platform.errors import AvccError
from app.platform.http.responses import json_error
from app.platform.http.signing import (
    HEADER_KEY,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    NONCE_MAX,
    NONCE_MIN,
    AuthFailureReason,
    NonceCache,
    body_sha256,
    canonical_request,
    default_nonce_cache,
    sign_request,
    signature,
)
from app.platform.metrics import AUTH_FAILURES
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
    "read_body",
    "require_hmac",
    "sign_request",
    "signature",
    "verify_headers",
]

#: ``request[KEY_ID_ATTRIBUTE]`` holds the authenticated key id inside a :func:`require_hmac` view.
KEY_ID_ATTRIBUTE: Final = "avcc_key_id"

_HEX: Final = frozenset("0123456789abcdef")


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
    nonce_ok = NONCE_MIN <= len(nonce) <= NONCE_MAX and nonce.isascii() and nonce.isprintable()
    if not nonce_ok or " " in nonce:
        raise _fail(
            "missing_header", f"{HEADER_NONCE} must be {NONCE_MIN}-{NONCE_MAX} printable ASCII characters"
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
    forwarded: bool = False,
    nonces: NonceCache | None = None,
) -> web.Response | None:
    """``None`` when the request is authentic, else the 401 answer to return as is.

    The one-liner for views that read the body themselves::

        denied = await authorize(request, body, settings)
        if denied is not None:
            return denied

    ``forwarded`` (a request relayed by the peer worker that owns a partition, already
    authenticated there) skips the nonce check; the signature and timestamp are still verified.
    The answer is counted like every other by the worker's request-counting middleware.
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
