"""Routing of requests about one table key to the worker that owns its partition.

A record's state lives on the worker owning its table partition; any worker accepts the
request, checks its signature and scope, and forwards it (marked with :func:`forward_token`, so
the owner answers instead of forwarding again) to the owner. The owner checks the request again
and claims its nonce: a request is claimed only where it is answered, so the same request sent
to two replicas meets its first claim in the shared nonce store whichever replica owns it.
:func:`record_request` and :func:`answer_at_owner` are the prologue of ``/v1/.../{avcc_record_id}``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from app.platform.credentials import Scope
from app.platform.http.auth import HEADER_SIGNATURE, RequestRefused, SignedRequest, authenticate, claim_nonce
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
    app: Any, table: Any, signed: RecordRequest, request: web.Request, settings: Settings
) -> web.Response | None:
    """The answer to send: the owner's when another worker owns the record's partition of
    ``table``, a refusal when the nonce was used; ``None`` when this worker must answer (the
    nonce is then claimed)."""
    if not signed.forwarded:
        owner = owner_url(app, table, signed.key)
        if owner is None:
            return json_error(503, "partition owner unknown (rebalancing); retry", retry_after_s=1)
        if not is_local(app, owner):
            return await forward_to(owner, request, signed.body, settings)
    try:
        await claim_nonce(signed.signed, settings)
    except RequestRefused as exc:
        return exc.response()
    return None


@dataclass(frozen=True, slots=True)
class RecordRequest:
    """A signed request about one record: the request, its record id and key, and whether a
    peer worker forwarded it."""

    signed: SignedRequest
    record_id: int
    key: bytes
    forwarded: bool

    @property
    def body(self) -> bytes:
        """The raw body."""
        return self.signed.body


#: Record ids are positive decimal integers of at most 19 digits (they fit a signed 64-bit int).
_MAX_RECORD_ID_DIGITS = 19


async def record_request(
    request: web.Request, avcc_record_id: str, settings: Settings, *, scope: Scope
) -> RecordRequest | web.Response:
    """Authenticate a ``/v1/.../{avcc_record_id}`` request (signature and scope; the nonce is
    claimed by :func:`answer_at_owner`) and parse its id; the refusal (401, 403, 400) otherwise."""
    try:
        signed = await authenticate(request, settings, scope=scope, check_nonce=False)
    except RequestRefused as exc:
        return exc.response()
    digits = avcc_record_id
    if not (digits.isascii() and digits.isdigit() and len(digits) <= _MAX_RECORD_ID_DIGITS):
        return json_error(400, "avcc_record_id: must be a decimal integer", fields=["avcc_record_id"])
    record_id = int(digits)
    return RecordRequest(signed, record_id, record_key(record_id), is_forwarded(request, settings))
