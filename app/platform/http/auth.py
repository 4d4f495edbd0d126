"""HMAC request authentication and key scopes of every ``/v1/`` endpoint.

One flow, :func:`authenticate`, in the order that keeps pre-auth work bounded:

1. **Headers, before any body byte is read**: all four present and well formed
   (``missing_header``), the key known, the timestamp within ``settings.hmac_max_skew_ms`` of
   the server clock either way (``stale_timestamp``), the signature 64 hex digits.
2. **The body**, read with a size limit (413) and a time limit (408).
3. **The signature** over method, path and query, timestamp, nonce and body hash (constant-time
   compare). An unknown key gets exactly the answer of a wrong signature, so key ids cannot be
   enumerated (the metric still tells them apart).
4. **The scope**: the key must hold the route's scope (403 ``reason: scope``).
5. **The nonce**, last, so forged or out-of-scope requests never burn one: claimed in the nonce
   store (:mod:`app.platform.http.nonces`) shared by every replica (``replayed_nonce``).

Every refusal is a :class:`RequestRefused` whose :meth:`~RequestRefused.response` is the JSON
answer. The signing side lives in :mod:`app.platform.http.signing` (re-exported here).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from aiohttp import web
from pydantic import BaseModel

from app.platform.credentials import ApiKey, Scope
from app.platform.errors import DependencyUnavailable
from app.platform.http.nonces import LocalNonces, NonceStore, nonce_store
from app.platform.http.responses import RequestRefused, json_error, parse_body
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
from app.platform.metrics import AUTH_FAILURES, STAGE_SECONDS
from app.platform.settings import Settings, get_settings

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "HEADER_KEY",
    "HEADER_NONCE",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "KEY_ID_ATTRIBUTE",
    "AuthFailureReason",
    "AuthenticationFailed",
    "BodyTimeout",
    "Credentials",
    "Forbidden",
    "NonceCache",
    "PayloadTooLarge",
    "RequestRefused",
    "SignedRequest",
    "authenticate",
    "body_sha256",
    "canonical_request",
    "check_headers",
    "claim_nonce",
    "default_nonce_cache",
    "read_body",
    "require_hmac",
    "sign_request",
    "signature",
    "signed_json",
    "verify_headers",
]

#: ``request[KEY_ID_ATTRIBUTE]`` holds the authenticated key id inside a :func:`require_hmac` view.
KEY_ID_ATTRIBUTE: Final = web.RequestKey("avcc_key_id", str)
#: Largest body of a signed request other than a playback batch (which has its own setting).
DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024

_HEX: Final = frozenset("0123456789abcdef")
_M = TypeVar("_M", bound=BaseModel)
_BAD_SIGNATURE: Final = "signature does not match the request"


class AuthenticationFailed(RequestRefused):
    """A ``/v1/`` request was refused (401). ``reason`` says which check failed.

    The client must sign with a configured key, a fresh nonce and a current timestamp
    (see the module docstring for the canonical request).
    """

    status = 401

    def __init__(self, reason: AuthFailureReason, message: str) -> None:
        super().__init__(message, reason=reason)
        self.message = message

    def response(self) -> web.Response:
        """401; an unknown key is answered exactly like a wrong signature."""
        if self.reason == "unknown_key":
            return json_error(401, _BAD_SIGNATURE, reason="bad_signature")
        return json_error(401, self.message, reason=self.reason)


class Forbidden(RequestRefused):
    """The key is valid but lacks the route's scope (403). Ask for a key with that scope."""

    status = 403
    reason = "scope"

    def __init__(self, scope: Scope) -> None:
        super().__init__(f"this key may not use this route; it needs the scope {scope!r}", required=scope)
        self.required = scope


class PayloadTooLarge(RequestRefused):
    """The request body exceeds the endpoint's limit (413). Split the batch and resend."""

    status = 413
    reason = "body_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than {limit} bytes", limit_bytes=limit)
        self.limit = limit


class BodyTimeout(RequestRefused):
    """The client did not send its body within ``AVCC_HTTP_BODY_TIMEOUT_S`` (408)."""

    status = 408
    reason = "body_timeout"


class NonceStoreUnavailable(RequestRefused):
    """The shared nonce store did not answer (503): the request may be signed again and resent."""

    status = 503
    reason = "unavailable"
    retry_after_s = 1


async def read_body(request: Any, max_bytes: int, timeout_s: float | None = None) -> bytes:
    """The raw body of an aiohttp request: ``PayloadTooLarge`` past ``max_bytes``, ``BodyTimeout``
    past ``timeout_s``.

    Checks ``Content-Length`` first, then counts while streaming (chunked bodies), so a huge
    body is never buffered. Reads the body once: pass the result on instead of reading again.
    """
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise PayloadTooLarge(max_bytes)

    async def stream() -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge(max_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    if timeout_s is None:
        return await stream()
    try:
        return await asyncio.wait_for(stream(), timeout_s)
    except TimeoutError:
        raise BodyTimeout(f"request body not received within {timeout_s:g} s") from None


def _fail(reason: AuthFailureReason, message: str) -> AuthenticationFailed:
    AUTH_FAILURES.labels(reason).inc()
    return AuthenticationFailed(reason, message)


@dataclass(frozen=True, slots=True)
class Credentials:
    """The checked signing headers of one request (its signature not yet compared)."""

    key_id: str
    key: ApiKey
    timestamp_ms: int
    timestamp_text: str
    nonce: str
    signature: str


def check_headers(headers: Mapping[str, str], settings: Settings, now_ms: int | None = None) -> Credentials:
    """Step 1: everything that needs no body; raise ``AuthenticationFailed``."""
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
        values[HEADER_SIGNATURE].lower(),
    )
    if not (ts_text.isascii() and ts_text.isdigit() and len(ts_text) <= 16):
        raise _fail("missing_header", f"{HEADER_TIMESTAMP} must be unix milliseconds (decimal digits)")
    nonce_ok = NONCE_MIN <= len(nonce) <= NONCE_MAX and nonce.isascii() and nonce.isprintable()
    if not nonce_ok or " " in nonce:
        raise _fail(
            "missing_header", f"{HEADER_NONCE} must be {NONCE_MIN}-{NONCE_MAX} printable ASCII characters"
        )
    key = settings.api_keys().get(key_id)
    if key is None:
        raise _fail("unknown_key", _BAD_SIGNATURE)
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    timestamp = int(ts_text)
    skew = settings.hmac_max_skew_ms
    if abs(now - timestamp) > skew:
        raise _fail("stale_timestamp", f"timestamp is more than {skew} ms away from the server clock")
    if len(given) != 64 or not set(given) <= _HEX:
        raise _fail("bad_signature", "signature must be 64 hex digits of HMAC-SHA256")
    return Credentials(key_id, key, timestamp, ts_text, nonce, given)


def _verify_signature(credentials: Credentials, method: str, path_qs: str, body: bytes) -> None:
    secret = credentials.key.secret.get_secret_value()
    expected = signature(secret, method, path_qs, credentials.timestamp_text, credentials.nonce, body)
    if not hmac.compare_digest(expected, credentials.signature):
        raise _fail("bad_signature", _BAD_SIGNATURE)


def _refuse_replay(reason: AuthFailureReason | None) -> None:
    if reason == "replayed_nonce":
        raise _fail("replayed_nonce", "nonce already used")
    if reason is not None:
        raise _fail(reason, "request signed too long ago to be checked for replay; sign it again")


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
    """Synchronous check of a request already read, with a process-local nonce cache; the key id.

    For callers outside a web worker (and the unit tests of each refusal); views use
    :func:`authenticate`, whose nonces are shared by every replica.
    """
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    credentials = check_headers(headers, settings, now)
    _verify_signature(credentials, method, path_qs, body)
    if check_nonce:
        cache = nonces if nonces is not None else default_nonce_cache(settings)
        _refuse_replay(
            cache.check_and_add(credentials.key_id, credentials.nonce, credentials.timestamp_ms, now)
        )
    return credentials.key_id


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """An authenticated request: its key, its body, and its credentials (for the nonce claim)."""

    credentials: Credentials
    body: bytes

    @property
    def key_id(self) -> str:
        """The API key that signed the request."""
        return self.credentials.key_id


def _store(settings: Settings, nonces: NonceStore | NonceCache | None) -> NonceStore:
    if isinstance(nonces, NonceCache):
        return LocalNonces(nonces)
    return nonces if nonces is not None else nonce_store(settings)


async def claim_nonce(
    signed: SignedRequest, settings: Settings, nonces: NonceStore | NonceCache | None = None
) -> None:
    """Step 5 on its own, for routes that first find the worker that must answer."""
    credentials = signed.credentials
    try:
        with STAGE_SECONDS.labels("nonce").time():
            reason = await _store(settings, nonces).claim(
                credentials.key_id, credentials.nonce, credentials.timestamp_ms, time.time_ns() // 1_000_000
            )
    except DependencyUnavailable as exc:
        raise NonceStoreUnavailable(str(exc)) from None
    _refuse_replay(reason)


async def authenticate(
    request: Any,
    settings: Settings,
    *,
    scope: Scope,
    body: bytes | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    nonces: NonceStore | NonceCache | None = None,
    check_nonce: bool = True,
) -> SignedRequest:
    """Steps 1-5 of the module doc for an aiohttp/faust request; raise :class:`RequestRefused`.

    ``check_nonce=False`` leaves step 5 to :func:`claim_nonce` (a route that may forward the
    request to the worker owning its record claims the nonce where it is answered). The key id
    is also stored in ``request[KEY_ID_ATTRIBUTE]``.
    """
    credentials = check_headers(request.headers, settings)
    raw = body if body is not None else await read_body(request, max_body_bytes, settings.http_body_timeout_s)
    _verify_signature(credentials, str(request.method), str(request.path_qs), raw)
    if not credentials.key.allows(scope):
        raise Forbidden(scope)
    signed = SignedRequest(credentials, raw)
    if check_nonce:
        await claim_nonce(signed, settings, nonces)
    request[KEY_ID_ATTRIBUTE] = credentials.key_id
    return signed


async def signed_json(
    request: Any, settings: Settings, model: type[_M], *, scope: Scope
) -> tuple[SignedRequest, _M] | web.Response:
    """Authenticate a request with a JSON object body and validate it against ``model``; the
    refusal (401, 403, 408, 413) or the 400 naming the fields instead."""
    try:
        signed = await authenticate(request, settings, scope=scope)
        return signed, parse_body(model, signed.body)
    except RequestRefused as exc:  # the body's BadRequest too
        return exc.response()


_Handler = Callable[..., Awaitable[Any]]


def require_hmac(scope: Scope) -> Callable[[_Handler], _Handler]:
    """Decorate a faust ``View`` method (``async def get(self, request)``) with HMAC auth.

    Refused requests get their JSON answer; inside the handler ``request[KEY_ID_ATTRIBUTE]`` is
    the key id. Bodies are limited to :data:`DEFAULT_MAX_BODY_BYTES`.
    """

    def decorate(handler: _Handler) -> _Handler:
        @functools.wraps(handler)
        async def wrapper(view: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                await authenticate(request, get_settings(), scope=scope)
            except RequestRefused as exc:
                return exc.response()
            return await handler(view, request, *args, **kwargs)

        return wrapper

    return decorate
