"""Gateway group (gateway-svc): ``POST /v1/playback/events`` -> ``topic.playback.event`` (seed 9.2.4).

A partner posts a batch of playback reports, signed with HMAC (:mod:`app.platform.http.auth`);
the endpoint (:mod:`app.playback.gateway.endpoint`) reads, validates and produces the batch
(:mod:`app.playback.gateway.ingest`: JSON array or NDJSON, event ids, envelope framing); this
module mounts it on the gateway's App. Valid
items are produced, invalid ones are reported by index::

    202 {"accepted": 2, "rejected": 1, "errors": [{"index": 1, "error": "user_hash: must be ..."}]}

Limits (settings ``AVCC_GATEWAY_*``): body bytes and item count (413), producer queue depth
(429 with ``Retry-After``). The queue is checked before anything is produced, so a 429 normally
means nothing of the batch was produced; if librdkafka's own queue fills half-way through a
batch the answer is also 429 and reports exactly which items were accepted (``accepted`` counts
them, the rest carry ``"error": "producer queue full, retry later"``), so the partner resends
only those.

Run: ``faust -A agents.gateway worker --web-port 6071`` (or ``avcc worker gateway``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import mode
from aiohttp import web

from app.api import PLAYBACK_EVENTS
from app.platform.faust.app import get_app
from app.platform.http.openapi import route
from app.platform.http.views import install_common_views
from app.platform.settings import get_settings
from app.playback.gateway.endpoint import ROUTE, PlaybackIngest

__all__ = ["ROUTE", "GatewayEndpoint", "PlaybackEvents", "app", "endpoint"]


app: faust.App = get_app("gateway")
# The gateway produces with its own confluent producer and consumes nothing: faust's Kafka
# clients would only join a group and open connections for nothing. The web server still runs.
app.boot_strategy = app.BootStrategy(app, enable_kafka=False)
install_common_views(app, "gateway", export_lag=False)


class GatewayEndpoint(mode.Service):
    """Holds the worker's endpoint (built on the first request, which connects its producer) and
    flushes the playback producer when the worker stops."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.running: PlaybackIngest | None = None

    def ingest(self) -> PlaybackIngest:
        """The worker's endpoint."""
        if self.running is None:
            self.running = PlaybackIngest(get_settings())
        return self.running

    async def on_stop(self) -> None:
        ingest, self.running = self.running, None
        if ingest is not None:
            await asyncio.get_running_loop().run_in_executor(None, ingest.close, 10.0)


#: The worker's endpoint, held by the service that flushes it at stop.
endpoint = GatewayEndpoint()
app.service(endpoint)  # type: ignore[arg-type]  # faust takes a service instance too


@route(app, PLAYBACK_EVENTS)
class PlaybackEvents(faust.web.View):
    """``POST /v1/playback/events``: a signed batch of playback reports."""

    async def post(self, request: web.Request) -> web.Response:
        return await endpoint.ingest().handle(request)
