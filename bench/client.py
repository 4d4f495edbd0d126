"""Signed HTTP calls of the benches and the integration stacks, each sent again after a ``503``
once the wait it asks for is over, as a partner's client does (``app.client``): a worker that
is ready can still answer 503 for a moment (its nonce store catching up, a rebalance), and a
bench or a test that takes that for a failure measures or asserts nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from app.client import retry_after_s
from app.platform.http.auth import sign_request

__all__ = ["Answer", "call", "settled", "signed_call"]


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP answer: its status, its body (decoded JSON, else text) and the wait it asks for."""

    status: int
    body: Any
    #: Seconds to wait before sending again: ``Retry-After``, else the body's ``retry_after_s``,
    #: else 1 s (meaningful for a 429 or a 503).
    retry_after_s: float


def _asked_wait(header: str | None, body: Any) -> float:
    if header:
        return retry_after_s(header)
    asked = body.get("retry_after_s") if isinstance(body, dict) else None
    return float(asked) if isinstance(asked, int | float) else 1.0


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    data: bytes = b"",
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """One request, sent once."""
    async with session.request(method, url, data=data, headers=headers) as response:
        raw = await response.read()
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw.decode(errors="replace")
        return Answer(response.status, body, _asked_wait(response.headers.get("Retry-After"), body))


async def signed_call(
    session: aiohttp.ClientSession,
    base: str,
    method: str,
    path: str,
    body: bytes,
    key: str,
    secret: str,
    content_type: str | None = None,
) -> Answer:
    """One request to ``base + path`` with fresh ``X-AVCC-*`` headers (a nonce is good once)."""
    headers = sign_request(method, path, body, key, secret)
    if content_type is not None:
        headers["Content-Type"] = content_type
    return await call(session, method, base + path, body, headers)


async def settled(send: Callable[[], Awaitable[Answer]], *, wait_s: float = 60.0) -> Answer:
    """The answer of ``send()``, called again after each 503 once its wait is over, for as long as
    ``wait_s`` allows; the last answer (a 503 still, when ``wait_s`` ran out). ``send`` must build
    a new request each time (e.g. :func:`signed_call`: a resent signature is a replay)."""
    deadline = time.monotonic() + wait_s
    while True:
        answer = await send()
        if answer.status != 503 or time.monotonic() >= deadline:
            return answer
        await asyncio.sleep(answer.retry_after_s)
