"""HTTP glue shared by the groups' web views: JSON bodies, errors, auth, routing to owners."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from app.platform.http.auth import AuthenticationFailed, NonceCache, verify_headers
from app.platform.kafka.partitioner import partition_for, record_key
from app.platform.metrics import HTTP_REQUESTS
from app.platform.settings import Settings
from schemas.violations import to_schema_violation

__all__ = [
    "FORWARD_HEADER",
    "BadRequest",
    "answer_at_owner",
    "authorize",
    "forward_to",
    "is_forwarded",
    "json_error",
    "json_response",
    "parse_body",
]

_M = TypeVar("_M", bound=BaseModel)

#: Set by a worker that forwards a request to the owner of a table partition.
FORWARD_HEADER = "X-AVCC-Forwarded"


class BadRequest(Exception):
    """The request body is unusable; ``fields`` names the offending fields."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields


def json_response(body: Any, status: int = 200, route: str = "", method: str = "") -> web.Response:
    """A JSON response (orjson), counted by route and status."""
    if route:
        HTTP_REQUESTS.labels(route, method, str(status)).inc()
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def json_error(status: int, error: str, route: str = "", method: str = "", **extra: Any) -> web.Response:
    """A JSON error ``{"error": ..., **extra}``."""
    return json_response({"error": error, **extra}, status, route, method)


def parse_body(model: type[_M], raw: bytes) -> _M:
    """Validate a JSON body against ``model``; :class:`BadRequest` names the fields."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body: malformed JSON ({exc})", ("body",)) from exc
    if not isinstance(data, dict):
        raise BadRequest("body: must be a JSON object", ("body",))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        violation = to_schema_violation(exc)
        raise BadRequest(str(violation), violation.fields) from exc


def forward_token(settings: Settings, signature: str) -> str:
    """Proof that a forwarded request was authenticated by a worker holding the secrets."""
    secret = "\n".join(sorted(settings.effective_hmac_keys().values())).encode()
    return hmac.new(secret, b"forward\n" + signature.encode(), hashlib.sha256).hexdigest()


def is_forwarded(request: web.Request, settings: Settings) -> bool:
    """Whether ``request`` was forwarded by a peer worker that already checked its nonce."""
    token = request.headers.get(FORWARD_HEADER)
    signature = request.headers.get("X-AVCC-Signature", "")
    return bool(token) and hmac.compare_digest(token or "", forward_token(settings, signature))


async def forward_to(base_url: str, request: web.Request, body: bytes, settings: Settings) -> web.Response:
    """Send ``request`` (with its body) to the worker at ``base_url`` and relay the answer."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in {"host", "content-length"}}
    headers[FORWARD_HEADER] = forward_token(settings, request.headers.get("X-AVCC-Signature", ""))
    url = base_url.rstrip("/") + request.path_qs
    timeout = aiohttp.ClientTimeout(total=15)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.request(request.method, url, data=body, headers=headers) as response,
    ):
        payload = await response.read()
        return web.Response(
            body=payload, status=response.status, content_type=response.content_type or "application/json"
        )


async def authorize(
    request: web.Request, body: bytes, settings: Settings, *, route: str, forwarded: bool = False
) -> web.Response | None:
    """Check the request's HMAC signature; the 401 answer to send, or ``None`` when allowed.

    A request forwarded by a peer worker (see :func:`forward_to`) had its nonce checked there, so
    only its signature and timestamp are checked again here.
    """
    nonces = NonceCache(2 * settings.hmac_max_skew_ms) if forwarded else None
    try:
        verify_headers(
            str(request.method), str(request.path_qs), request.headers, body, settings, nonces=nonces
        )
    except AuthenticationFailed as exc:
        HTTP_REQUESTS.labels(route, str(request.method), "401").inc()
        return exc.response()
    return None


def owner_url(app: Any, table: Any, key: bytes) -> str | None:
    """Base URL of the worker that owns ``key``'s partition of ``table`` (``None`` if unknown).

    The partition is murmur2 of the key like every producer computes it; the owner comes from
    faust's assignment metadata of the table's changelog topic.
    """
    partition = partition_for(key, int(table.partitions))
    topic = table.changelog_topic.get_topic_name()
    for url, topics in app.router.table_metadata(table.name).items():
        if partition in topics.get(topic, ()):
            return str(url).rstrip("/")
    return None


def is_local(app: Any, url: str) -> bool:
    """Whether ``url`` is this worker."""
    return url == str(app.conf.canonical_url).rstrip("/")


async def answer_at_owner(
    app: Any,
    table: Any,
    key: bytes,
    request: web.Request,
    body: bytes,
    settings: Settings,
    *,
    forwarded: bool,
    route: str,
) -> web.Response | None:
    """The owner's answer when another worker owns ``key``'s partition of ``table``; ``None``
    when this worker owns it (or the request was already forwarded here) and must answer."""
    if forwarded:
        return None
    owner = owner_url(app, table, key)
    if owner is None:
        return json_error(503, "partition owner unknown (rebalancing); retry", route, str(request.method))
    if is_local(app, owner):
        return None
    return await forward_to(owner, request, body, settings)


@dataclass(frozen=True, slots=True)
class RecordRequest:
    """A signed request about one record: its body, record id and key, and whether a peer
    worker forwarded it."""

    body: bytes
    record_id: int
    key: bytes
    forwarded: bool


async def record_request(
    request: web.Request, avcc_record_id: str, settings: Settings, *, route: str
) -> RecordRequest | web.Response:
    """Authenticate a ``/v1/.../{avcc_record_id}`` request and parse its id; the error answer
    (401, 400) instead when it is refused."""
    body = await request.read()
    forwarded = is_forwarded(request, settings)
    denied = await authorize(request, body, settings, route=route, forwarded=forwarded)
    if denied is not None:
        return denied
    if not avcc_record_id.isdigit():
        return json_error(400, "avcc_record_id: must be a decimal integer", route, str(request.method))
    record_id = int(avcc_record_id)
    return RecordRequest(body, record_id, record_key(record_id), forwarded)
