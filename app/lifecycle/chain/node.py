"""Ledger node: the local ledger served over HTTP, so every chain replica notarises on one chain.

The local ledger is a single writer (RocksDB's lock). Chain replicas that each opened their own
would each be a chain of their own: a transaction submitted by a partition's first owner, which
lost the partition before it recorded the receipt, is submitted again by the new owner -- to a
different ledger, so it would be notarised twice. Served by one node, a key is notarised once
whoever submits it, exactly as on an EVM chain, whose contract refuses a second registration.

Routes (all but ``/health`` and ``/metrics`` need ``Authorization: Bearer <AVCC_CHAIN_NODE_TOKEN>``):

* ``POST /v1/ledger/transactions``: a transaction document -> its receipt once sealed in a
  block (a known key answers the original receipt at once).
* ``GET /v1/ledger/receipts/{idempotency_key}``: the receipt of a sealed key, or 404.
* ``GET /health``: the tip height; ``GET /metrics``: Prometheus text, every answer counted in
  ``avcc_http_requests_total`` (refusals included) as on the workers.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from prometheus_client import generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.lifecycle.chain.blocks import PendingTx
from app.lifecycle.chain.ledger import LocalLedger
from app.platform.errors import DependencyUnavailable, SchemaViolation
from app.platform.http.counting import UNCOUNTED_ROUTES, count_requests
from app.platform.http.responses import json_error, json_response
from app.platform.http.views import METRICS_CONTENT_TYPE
from app.platform.metrics import REGISTRY
from schemas.types import ChainType

__all__ = [
    "RECEIPTS_PATH",
    "TRANSACTIONS_PATH",
    "TransactionDocument",
    "ledger_node_app",
    "run_ledger_node",
]

log = logging.getLogger(__name__)

TRANSACTIONS_PATH: Final = "/v1/ledger/transactions"
RECEIPTS_PATH: Final = "/v1/ledger/receipts"
#: Largest transaction document accepted (a settlement instruction is well under 4 KiB).
MAX_BODY_BYTES: Final = 256 * 1024
_LEDGER: Final = web.AppKey("ledger", LocalLedger)
_TOKEN: Final = web.AppKey("token", str)


class TransactionDocument(BaseModel):
    """What a chain replica submits: :meth:`PendingTx.document`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    idempotency_key: str = Field(min_length=1, max_length=256)
    chain_type: ChainType
    avcc_record_id: int = Field(ge=0)
    body: dict[str, Any]

    def pending_tx(self) -> PendingTx:
        """The ledger's transaction."""
        return PendingTx(self.idempotency_key, self.chain_type, self.avcc_record_id, self.body)


@web.middleware
async def _bearer_token(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every route but the probe and the scrape needs the node's token (constant-time compare)."""
    if request.path not in UNCOUNTED_ROUTES:
        supplied = request.headers.get("Authorization", "").removeprefix("Bearer ").encode()
        if not hmac.compare_digest(supplied, request.app[_TOKEN].encode()):
            return json_error(401, "missing or wrong bearer token", reason="token")
    response: web.StreamResponse = await handler(request)
    return response


async def _submit(request: web.Request) -> web.Response:
    try:
        document = TransactionDocument.model_validate_json(await request.read())
    except web.HTTPRequestEntityTooLarge:
        return json_error(413, f"transaction document over {MAX_BODY_BYTES} bytes", reason="too_large")
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        return json_error(400, "not a transaction document", reason="schema", details=errors)
    try:
        receipt = await request.app[_LEDGER].submit(document.pending_tx())
    except SchemaViolation as exc:
        return json_error(400, str(exc), reason="schema")
    except DependencyUnavailable as exc:
        log.error("ledger write failed: %s", exc)
        return json_error(503, "ledger write failed; retry", reason="unavailable", retry_after_s=1)
    return json_response(receipt.to_json())


async def _receipt(request: web.Request) -> web.Response:
    receipt = request.app[_LEDGER].receipt(request.match_info["key"])
    if receipt is None:
        return json_error(404, "no transaction with this idempotency key", reason="not_found")
    return json_response(receipt.to_json())


async def _health(request: web.Request) -> web.Response:
    return json_response({"status": "ok", "height": request.app[_LEDGER].height})


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": METRICS_CONTENT_TYPE})


def ledger_node_app(ledger: LocalLedger, token: str) -> web.Application:
    """The node's aiohttp application over an open ``ledger``."""
    if not token:
        raise ValueError("the ledger node needs a token")
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[count_requests, _bearer_token])
    app[_LEDGER] = ledger
    app[_TOKEN] = token
    app.router.add_post(TRANSACTIONS_PATH, _submit)
    app.router.add_get(RECEIPTS_PATH + "/{key}", _receipt)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


async def run_ledger_node(path: Path, host: str, port: int, token: str, block_interval_ms: int) -> None:
    """Serve the ledger at ``path`` on ``host:port`` until SIGTERM or SIGINT; pending
    transactions are sealed before the ledger closes."""
    ledger = LocalLedger(path, block_interval_ms)
    runner = web.AppRunner(ledger_node_app(ledger, token), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("ledger node on http://%s:%d serving %s (height %d)", host, port, path, ledger.height)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
        await ledger.aclose()
