"""Gateway group: ``POST /v1/playback/events`` -> ``topic.playback.event`` (seed 9.2.4).

A partner posts a batch of playback reports, signed with HMAC (:mod:`app.platform.http.auth`), as a JSON
array (``Content-Type: application/json``) or as NDJSON (``application/x-ndjson``, one object
per non-empty line). Each item is validated against :class:`schemas.playback.PlaybackEvent`;
valid items are wrapped in an envelope and produced with the playback profile (acks=1,
linger 5 ms, 64 KiB batches); invalid items are never produced and are reported by index::

    202 {"accepted": 2, "rejected": 1, "errors": [{"index": 1, "error": "user_hash: must be ..."}]}

``index`` is the position in the array, or among the non-empty lines of an NDJSON body.

Event ids: a fresh uuid4, or -- when the platform supplies ``idempotency_id`` -- the name-based
uuid5 of ``(platform_node, idempotency_id)``, so a retried item carries the same ``event_id``
and the sink/anomaly consumers deduplicate it. The message key is the event id: nothing on
this topic needs per-key order (each report is independent; the anomaly detector orders by
event time, not offsets), so keys only have to spread load evenly over the 24 partitions, and
a retried item still lands on the partition of its first copy.

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
import logging
import os
import time
import uuid
from typing import Any, Final

import faust
import mode
import orjson
from aiohttp import web
from confluent_kafka import KafkaException
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.platform.faust.app import get_app
from app.platform.groups import group_spec
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
from app.platform.metrics import EVENTS_OUT, INGEST_ITEMS
from app.platform.settings import Settings, get_settings
from app.platform.topics import PLAYBACK_EVENT
from schemas.playback import PlaybackEvent
from schemas.types import format_money
from schemas.violations import to_schema_violation

__all__ = [
    "EVENT_ID_NAMESPACE",
    "ROUTE",
    "GatewaySettings",
    "PlaybackEvents",
    "PlaybackIngest",
    "app",
    "envelope_bytes",
    "event_id_for",
    "parse_items",
]

log = logging.getLogger(__name__)

ROUTE: Final = "/v1/playback/events"
NDJSON: Final = "application/x-ndjson"
SOURCE: Final = group_spec("gateway").source
#: Namespace of name-based playback event ids: uuid5(NAMESPACE, "<platform_node>:<idempotency_id>").
EVENT_ID_NAMESPACE: Final = uuid.UUID("5d0c4c36-8f0e-5b5e-9a51-7f3b1c2a6e10")
_QUEUE_FULL: Final = "producer queue full, retry later"


class GatewaySettings(BaseSettings):
    """Limits of the playback gateway. Each field maps to ``AVCC_GATEWAY_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AVCC_GATEWAY_", frozen=True, extra="ignore")

    max_items: int = Field(default=5_000, ge=1, description="Most items per batch (more: 413).")
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="Largest request body in bytes (more: 413)."
    )
    max_queue: int = Field(
        default=100_000,
        ge=1,
        description="Producer queue depth (messages) above which batches get 429; keep it below "
        "the playback profile's queue.buffering.max.messages (200k).",
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After of a 429 answer.")
    topic: str | None = Field(default=None, description="Topic override (bench/tests; default: the plan's).")


class BatchError(Exception):
    """The body cannot be read as a batch (400/413/415); ``status`` and ``reason`` say why."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def event_id_for(event: PlaybackEvent, entropy: bytes | None = None) -> str:
    """The envelope ``event_id``: uuid5 of (platform_node, idempotency_id), else a fresh uuid4.

    ``entropy`` (16 random bytes) lets a batch draw its randomness with one ``os.urandom``.
    """
    if event.idempotency_id is not None:
        return str(uuid.uuid5(EVENT_ID_NAMESPACE, f"{event.platform_node}:{event.idempotency_id}"))
    raw = bytearray(entropy if entropy is not None else os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


#: The payload fields :func:`envelope_bytes` writes; checked against the contract at import, so
#: a new field in ``PlaybackEvent`` fails loudly here instead of being dropped silently.
_PAYLOAD_FIELDS: Final = (
    "avcc_code",
    "platform_node",
    "user_hash",
    "event_type",
    "duration_sec",
    "revenue_cny",
    "idempotency_id",
)
if set(PlaybackEvent.model_fields) != set(_PAYLOAD_FIELDS):  # pragma: no cover - contract guard
    raise ImportError(
        f"agents.gateway writes {_PAYLOAD_FIELDS}; PlaybackEvent has {set(PlaybackEvent.model_fields)}"
    )


def envelope_bytes(event: PlaybackEvent, event_id: str, timestamp_ms: int) -> bytes:
    """The envelope ``{"event_id", "timestamp", "source", "payload"}`` as compact JSON bytes.

    The document ``codec.dumps(make_envelope(...))`` writes (minus a ``null`` idempotency id),
    built from the validated model's attributes: ~4x cheaper than pydantic's serializer.
    """
    payload: dict[str, Any] = {
        "avcc_code": event.avcc_code,
        "platform_node": event.platform_node,
        "user_hash": event.user_hash,
        "event_type": event.event_type,
        "duration_sec": event.duration_sec,
        "revenue_cny": format_money(event.revenue_cny),
    }
    if event.idempotency_id is not None:
        payload["idempotency_id"] = event.idempotency_id
    return orjson.dumps(
        {"event_id": event_id, "timestamp": timestamp_ms, "source": SOURCE, "payload": payload}
    )


def parse_items(body: bytes, content_type: str) -> tuple[list[Any], dict[int, str]]:
    """The batch items and the per-index errors of NDJSON lines that are not JSON.

    Raises :class:`BatchError` for an unsupported content type, a body that is not a JSON array
    (JSON) and an empty batch.
    """
    errors: dict[int, str] = {}
    if content_type == NDJSON:
        items: list[Any] = []
        for line in body.split(b"\n"):
            if not line.strip():
                continue
            try:
                items.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                errors[len(items)] = f"<root>: malformed JSON ({' '.join(str(exc).split())})"
                items.append(None)
    elif content_type in {"application/json", ""}:
        try:
            decoded = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BatchError(400, "malformed_json", f"body: malformed JSON ({exc})") from exc
        if not isinstance(decoded, list):
            raise BatchError(400, "not_an_array", "body: must be a JSON array of playback events")
        items = decoded
    else:
        raise BatchError(415, "unsupported_media_type", f"Content-Type must be application/json or {NDJSON}")
    if not items:
        raise BatchError(400, "empty_batch", "body: the batch has no items")
    return items, errors


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
            self._producer = EventProducer(self.settings, "playback", client_id="avcc-gateway")
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
        timestamp_ms = time.time_ns() // 1_000_000
        topic = self.topic
        accepted = 0
        throttled_from: int | None = None
        validate = PlaybackEvent.model_validate
        entropy = os.urandom(16 * len(items))
        for index, item in enumerate(items):
            if index in errors:
                continue
            if not isinstance(item, dict):
                errors[index] = "<root>: must be a JSON object"
                continue
            try:
                event = validate(item)
            except ValidationError as exc:
                errors[index] = str(to_schema_violation(exc))
                continue
            event_id = event_id_for(event, entropy[16 * index : 16 * index + 16])
            try:
                producer.send_nowait(topic, envelope_bytes(event, event_id, timestamp_ms), event_id.encode())
            except BufferError:
                throttled_from = index
                break
            except KafkaException as exc:
                log.error("produce to %s failed: %s", topic, exc)
                throttled_from = index
                break
            accepted += 1
        if throttled_from is not None:
            for index in range(throttled_from, len(items)):
                errors.setdefault(index, _QUEUE_FULL)
        rejected = len(errors)
        if accepted:
            INGEST_ITEMS.labels("accepted").inc(accepted)
            EVENTS_OUT.labels("gateway", topic).inc(accepted)
        if rejected:
            INGEST_ITEMS.labels("rejected").inc(rejected)
        body: dict[str, Any] = {
            "accepted": accepted,
            "rejected": rejected,
            "errors": [{"index": i, "error": errors[i]} for i in sorted(errors)],
        }
        if throttled_from is None:
            return json_response(body, 202)
        retry = self.limits.retry_after_s
        body.update(error=_QUEUE_FULL, reason="backpressure", retry_after_s=retry)
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
