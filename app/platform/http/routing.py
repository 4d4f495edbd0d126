"""Routing of requests about one table key to the worker that owns its partition.

A record's state lives on the worker owning its table partition; any worker accepts the
request, authenticates it, and forwards it (signed with :func:`forward_token`) to the owner,
which answers. :func:`record_request` is the common prologue of ``/v1/.../{avcc_record_id}``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from app.platform.http.auth import HEADER_SIGNATURE, authorize
from app.platform.http.responses import json_error
from app.platform.kafka.partitioner import partition_for, record_key
from app.platform.settings import Settings

__all__ = [
    "FORWARD_HEADER",
    "RecordRequest",
    "answer_at_owner",
    "forward_to",
    "forward_token",
    "is_forwarded",
    "is_local",
    "owner_url",
    "record_request",
]

#: Set by a worker that forwards a request to the owner of a table partition.
FORWARD_HEADER = "X-AVCC-Forwarded"


def forward_token(settings: Settings, signature: str) -> str:
    """Proof that a forwarded request was authenticated by a worker holding the secrets."""
    secret = "\n".join(sorted(settings.effective_hmac_keys().values())).encode()
    return hmac.new(secret, b"forward\n" + signature.encode(), hashlib.sha256).hexdigest()


def is_forwarded(request: web.Request, settings: Settings) -> bool:
    """Whether ``request`` was forwarded by a peer worker that already checked its nonce."""
    token = request.headers.get(FORWARD_HEADER)
    signature = request.headers.get(HEADER_SIGNATURE, "")
    return bool(token) and hmac.compare_digest(token or "", forward_token(settings, signature))


async def forward_to(base_url: str, request: web.Request, body: bytes, settings: Settings) -> web.Response:
    """Send ``request`` (with its body) to the worker at ``base_url`` and relay the answer."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in {"host", "content-length"}}
    headers[FORWARD_HEADER] = forward_token(settings, request.headers.get(HEADER_SIGNATURE, ""))
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
) -> web.Response | None:
    """The owner's answer when another worker owns ``key``'s partition of ``table``; ``None``
    when this worker owns it (or the request was already forwarded here) and must answer."""
    if forwarded:
        return None
    owner = owner_url(app, table, key)
    if owner is None:
        return json_error(503, "partition owner unknown (rebalancing); retry")
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
    request: web.Request, avcc_record_id: str, settings: Settings
) -> RecordRequest | web.Response:
    """Authenticate a ``/v1/.../{avcc_record_id}`` request and parse its id; the error answer
    (401, 400) instead when it is refused."""
    body = await request.read()
    forwarded = is_forwarded(request, settings)
    denied = await authorize(request, body, settings, forwarded=forwarded)
    if denied is not None:
        return denied
    if not (avcc_record_id.isascii() and avcc_record_id.isdigit() and len(avcc_record_id) <= 19):
        return json_error(400, "avcc_record_id: must be a decimal integer")
    record_id = int(avcc_record_id)
    return RecordRequest(body, record_id, record_key(record_id), forwarded)
