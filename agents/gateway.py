"""Gateway group (gateway-svc): ``POST /v1/playback/events`` -> ``topic.playback.event`` (seed 9.2.4).

A partner posts a batch of playback reports, signed with HMAC (:mod:`app.platform.http.auth`);
the batch is read, validated and produced by :mod:`app.playback.gateway.ingest` (JSON array or
NDJSON, event ids, envelope framing); this module holds the App and the HTTP endpoint. Valid
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
from typing import Any, Final

import faust
import mode
from aiohttp import web

from app.platform.faust.app import get_app
from app.platform.http.auth import (
    AuthenticationFailed,
    NonceCache,
    PayloadTooLarge,
    authenticate,
    read_body,
)
from app.platform.http.responses import json_error, json_response
from app.platform.http.views import install_common_views
from app.platform.kafka.producers import EventProducer
from app.platform.metrics import INGEST_ITEMS
from app.platform.settings import Settings, get_settings
from app.platform.topics import PLAYBACK_EVENT
from app.playback.gateway.ingest import (
    QUEUE_FULL,
    BatchError,
    GatewaySettings,
    admit,
    parse_items,
    playback_producer,
)

__all__ = [
    "ROUTE",
    "GatewayShutdown",
    "PlaybackEvents",
    "PlaybackIngest",
    "app",
    "ingest",
]


ROUTE: Final = "/v1/playback/events"


class PlaybackIngest:
    """The ingest endpoint's logic, independent of the faust app (tests mount it on aiohttp).

    ``producer`` is created on first use (playback profile) unless one is passed in.
    """

    def __init__(
        self,
        settings: Settings,
        limits: GatewaySettings | None = None,
        *,
        producer: EventProducer | None = None,
        topic: str | None = None,
        nonces: NonceCache | None = None,
    ) -> None:
        self.settings = settings
        self.limits = limits if limits is not None else GatewaySettings()
        self.topic = topic or self.limits.topic or PLAYBACK_EVENT.name
        self.nonces = nonces
        self._producer = producer

    @property
    def producer(self) -> EventProducer:
        """The playback-profile producer."""
        if self._producer is None:
            self._producer = playback_producer(self.settings)
        return self._producer

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush queued events and stop the producer."""
        if self._producer is not None:
            self._producer.close(timeout_s)
            self._producer = None

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one ``POST`` (counted in ``avcc_http_requests_total`` by the worker's middleware)."""
        limits = self.limits
        try:
            body = await read_body(request, limits.max_body_bytes)
        except PayloadTooLarge as exc:
            return exc.response()
        try:
            await authenticate(request, self.settings, body=body, nonces=self.nonces)
        except AuthenticationFailed as exc:
            return exc.response()
        try:
            # no Content-Type at all: JSON (aiohttp would report application/octet-stream)
            content_type = request.content_type if "Content-Type" in request.headers else ""
            items, errors = parse_items(body, content_type)
        except BatchError as exc:
            return json_error(exc.status, str(exc), reason=exc.reason)
        if len(items) > limits.max_items:
            return json_error(
                413,
                f"batch has {len(items)} items; the limit is {limits.max_items}",
                reason="too_many_items",
                limit_items=limits.max_items,
            )
        producer = self.producer
        if producer.queue_length() + len(items) > limits.max_queue:
            INGEST_ITEMS.labels("throttled").inc(len(items))
            return json_error(
                429,
                "the gateway is saturated; nothing of this batch was produced",
                reason="backpressure",
                retry_after_s=limits.retry_after_s,
            )
        return self._ingest(items, errors, producer)

    def _ingest(self, items: list[Any], errors: dict[int, str], producer: EventProducer) -> web.Response:
        admission = admit(items, errors, producer, self.topic)
        body = admission.body()
        if admission.throttled_from is None:
            return json_response(body, 202)
        retry = self.limits.retry_after_s
        body.update(error=QUEUE_FULL, reason="backpressure", retry_after_s=retry)
        return json_response(body, 429, {"Retry-After": str(retry)})


# --- the faust app of the gateway group --------------------------------------------------------

app: faust.App = get_app("gateway")
# The gateway produces with its own confluent producer and consumes nothing: faust's Kafka
# clients would only join a group and open connections for nothing. The web server still runs.
app.boot_strategy = app.BootStrategy(app, enable_kafka=False)
install_common_views(app, "gateway", export_lag=False)

_ingest: PlaybackIngest | None = None


def ingest() -> PlaybackIngest:
    """The process-wide endpoint (built on the first request)."""
    global _ingest
    if _ingest is None:
        _ingest = PlaybackIngest(get_settings())
    return _ingest


@app.page(ROUTE)
class PlaybackEvents(faust.web.View):
    """``POST /v1/playback/events``: a signed batch of playback reports."""

    async def post(self, request: web.Request) -> web.Response:
        return await ingest().handle(request)


@app.service
class GatewayShutdown(mode.Service):
    """Flushes the playback producer when the worker stops."""

    async def on_stop(self) -> None:
        global _ingest
        if _ingest is not None:
            endpoint, _ingest = _ingest, None
            await asyncio.get_running_loop().run_in_executor(None, endpoint.close, 10.0)
