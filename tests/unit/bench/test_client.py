"""The benches' client: a 503 is sent again, freshly signed, once the wait it asks for is over
(``Retry-After``, else the body's ``retry_after_s``), and given back when ``wait_s`` ran out."""

from __future__ import annotations

from functools import partial
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from app.platform.http.signing import HEADER_NONCE
from bench.client import Answer, settled, signed_call

Reply = tuple[int, dict[str, str], dict[str, Any]]


async def _send_settled(replies: list[Reply], wait_s: float) -> tuple[Answer, list[str]]:
    """POST once through :func:`settled` to a loopback server answering ``replies`` in turn;
    the answer and the nonce of every request the server got."""
    nonces: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        nonces.append(request.headers[HEADER_NONCE])
        status, headers, body = replies[min(len(nonces), len(replies)) - 1]
        return web.json_response(body, status=status, headers=headers)

    app = web.Application()
    app.router.add_post("/v1/x", handler)
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
        base = str(server.make_url("")).rstrip("/")
        send = partial(
            signed_call, session, base, "POST", "/v1/x", b"{}", "key", "secret", "application/json"
        )
        return await settled(send, wait_s=wait_s), nonces


async def test_a_503_is_sent_again_freshly_signed_until_it_is_answered() -> None:
    answer, nonces = await _send_settled(
        [
            (503, {"Retry-After": "0"}, {"error": "nonce store did not answer in time"}),
            (503, {}, {"error": "rebalancing", "retry_after_s": 0}),
            (202, {}, {"accepted": 1}),
        ],
        wait_s=60,
    )
    assert (answer.status, answer.body) == (202, {"accepted": 1})
    assert len(nonces) == len(set(nonces)) == 3


async def test_the_last_503_comes_back_with_its_wait_when_wait_s_ran_out() -> None:
    answer, nonces = await _send_settled([(503, {"Retry-After": "7"}, {"retry_after_s": 7})], wait_s=0)
    assert (answer.status, answer.retry_after_s) == (503, 7.0)
    assert len(nonces) == 1


async def test_an_answer_naming_no_wait_asks_for_one_second() -> None:
    answer, _ = await _send_settled([(429, {}, {"error": "saturated"})], wait_s=60)
    assert (answer.status, answer.retry_after_s) == (429, 1.0)
