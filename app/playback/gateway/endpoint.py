"""The playback ingest endpoint (``POST /v1/playback/events``) as a plain aiohttp handler.

It authenticates the partner, reads and validates the batch (:mod:`.ingest`) and produces the
valid items with the playback producer profile. It does not depend on the faust app, so tests
mount it on a bare aiohttp server; ``agents/gateway.py`` mounts it on the gateway worker.
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from app.platform.http.auth import NonceCache, RequestRefused, authenticate
from app.platform.http.batch_body import parse_items
from app.platform.http.nonces import NonceStore
from app.platform.http.responses import json_error, json_response
from app.platform.kafka.producers import EventProducer
from app.platform.metrics import INGEST_ITEMS
from app.platform.settings import Settings
from app.platform.topics import PLAYBACK_EVENT
from app.playback.api import PLAYBACK_EVENTS
from app.playback.gateway.ingest import QUEUE_FULL, admit, playback_producer
from app.playback.gateway.settings import GatewaySettings, get_gateway_settings

__all__ = ["ROUTE", "PlaybackIngest"]

ROUTE: Final = PLAYBACK_EVENTS.path


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
        nonces: NonceStore | NonceCache | None = None,
    ) -> None:
        self.settings = settings
        self.limits = limits if limits is not None else get_gateway_settings()
        self.topic = topic or PLAYBACK_EVENT.name
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
            signed = await authenticate(
                request,
                self.settings,
                scope="playback:write",
                max_body_bytes=limits.max_body_bytes,
                nonces=self.nonces,
            )
            # no Content-Type at all: JSON (aiohttp would report application/octet-stream)
            content_type = request.content_type if "Content-Type" in request.headers else ""
            items, errors = parse_items(signed.body, content_type, limits.max_items)
        except RequestRefused as exc:  # the body's BatchError too
            return exc.response()
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
