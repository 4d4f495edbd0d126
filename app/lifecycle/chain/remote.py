"""Chain backend of a chain replica that notarises on a ledger node (``AVCC_CHAIN_URL=ledger://host:port``).

Every replica of the chain group submits to the one node (:mod:`app.lifecycle.chain.node`), so a
transaction re-submitted by a partition's new owner gets the original receipt instead of a second
transaction. A node that cannot be reached, or answers 5xx, is ``DependencyUnavailable`` (the
error policy retries it); a refused document is a ``SchemaViolation`` (dead-lettered).
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import aiohttp
import orjson

from app.lifecycle.chain.blocks import PendingTx, Receipt
from app.lifecycle.chain.node import RECEIPTS_PATH, TRANSACTIONS_PATH
from app.platform.errors import ConfigurationError, DependencyUnavailable, SchemaViolation

__all__ = ["RemoteLedger"]

#: Longest wait for one submission (a block is sealed every ``AVCC_BLOCK_INTERVAL_MS``).
SUBMIT_TIMEOUT_S = 30.0


class RemoteLedger:
    """:class:`~app.lifecycle.chain.ledger.ChainBackend` over a ledger node's HTTP API."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = SUBMIT_TIMEOUT_S) -> None:
        if not token:
            raise ConfigurationError("AVCC_CHAIN_URL names a ledger node: set AVCC_CHAIN_NODE_TOKEN")
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._session

    async def submit(self, tx: PendingTx) -> Receipt:
        """Submit ``tx`` to the node and wait for its receipt (the original one for a known key)."""
        url = self.base_url + TRANSACTIONS_PATH
        try:
            async with self._client().post(url, data=orjson.dumps(tx.document())) as response:
                answer = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DependencyUnavailable(f"ledger node {self.base_url} unreachable: {exc!r}") from exc
        return _receipt_of(status, answer, self.base_url)

    def receipt(self, idempotency_key: str) -> Receipt | None:
        """The receipt of a sealed key, or ``None`` (a blocking call: for tools, not agents)."""
        url = f"{self.base_url}{RECEIPTS_PATH}/{urllib.parse.quote(idempotency_key, safe='')}"
        request = urllib.request.Request(url, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout.total) as response:
                return _receipt_of(response.status, response.read(), self.base_url)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            return _receipt_of(exc.code, exc.read(), self.base_url)
        except OSError as exc:
            raise DependencyUnavailable(f"ledger node {self.base_url} unreachable: {exc!r}") from exc

    def close(self) -> None:
        """Close the HTTP session (scheduled on the running event loop, if there is one)."""
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: the session went with it
            asyncio.get_running_loop().create_task(session.close())

    async def aclose(self) -> None:
        """Close the HTTP session."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _receipt_of(status: int, answer: bytes, node: str) -> Receipt:
    """The receipt in a node's answer, or the error it stands for."""
    if status == 200:
        data: dict[str, Any] = orjson.loads(answer)
        return Receipt.from_json(data)
    detail = answer[:500].decode(errors="replace")
    if status in (400, 413):
        raise SchemaViolation(f"ledger node {node} refused the transaction: {detail}", ["body"])
    if status == 401:
        raise ConfigurationError(f"ledger node {node} refused AVCC_CHAIN_NODE_TOKEN")
    raise DependencyUnavailable(f"ledger node {node} answered {status}: {detail}")
