"""Builds the faust App of an agent group; every other module gets its App from here."""

from __future__ import annotations

import ssl
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import faust
from faust.agents.models import ReqRepResponse
from faust.agents.replies import ReplyConsumer
from faust.models import maybe_model
from mode.utils.objects import cached_property

from app.platform.faust import transport
from app.platform.groups import group_spec
from app.platform.http.counting import count_requests
from app.platform.http.headers import security_headers
from app.platform.http.operators import OperatorGuard, operator_login
from app.platform.metrics import REPLIES_DROPPED
from app.platform.settings import Settings, get_settings
from app.platform.topics import reply_topic

__all__ = ["AvccApp", "consumer_group_id", "create_app", "get_app"]


def consumer_group_id(group: str) -> str:
    """Kafka consumer group (= faust App id) of an agent group."""
    return f"avcc-{group}"


def _credentials(settings: Settings) -> Any:
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = None
    if protocol in {"SSL", "SASL_SSL"}:
        context = ssl.create_default_context(
            cafile=str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
        )
        if settings.kafka_ssl_certfile:
            context.load_cert_chain(
                str(settings.kafka_ssl_certfile),
                str(settings.kafka_ssl_keyfile) if settings.kafka_ssl_keyfile else None,
            )
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    password = settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else ""
    mechanism = settings.kafka_sasl_mechanism or "PLAIN"
    if mechanism == "PLAIN":
        return faust.SASLCredentials(
            username=settings.kafka_sasl_username, password=password, ssl_context=context
        )
    return faust.SASLCredentials(
        username=settings.kafka_sasl_username,
        password=password,
        ssl_context=context,
        mechanism=mechanism,
    )


class _ReplyConsumer(ReplyConsumer):
    """faust's reply consumer with an ack-free reply topic, tolerant of duplicate replies.

    faust reads replies with ``async for`` and so never acks the last reply; a worker that waits
    for its streams at a rebalance or shutdown (``stream_wait_empty``) then waits forever.
    Replies are not offsets anybody commits, so the topic is not tracked for acks at all.

    faust's reply producer is not idempotent: after a lost acknowledgement (a broker failover)
    or a redelivered request (a rebalance) a reply can arrive twice, and faust's
    ``ReplyPromise.fulfill`` then raises ``InvalidStateError`` on the finished future, which
    stops the reply consumer and crashes the worker. A reply is delivered to each waiting
    promise once; its correlation id is then forgotten, so a duplicate finds nobody waiting.
    Each dropped reply is counted in ``avcc_replies_dropped_total``.
    """

    async def _drain_replies(self, channel: Any) -> None:
        app_id = str(self.app.conf.id)
        async for reply in channel.stream():
            promises = list(self._waiting.pop(reply.correlation_id, ()))
            if not promises:
                REPLIES_DROPPED.labels(app_id, "nobody_waiting").inc()
            for promise in promises:
                if promise.done():
                    REPLIES_DROPPED.labels(app_id, "already_answered").inc()
                else:
                    promise.fulfill(reply.correlation_id, maybe_model(reply.value))

    def _reply_topic(self, topic: str) -> Any:
        return self.app.topic(
            topic,
            partitions=1,
            replicas=self.app.conf.topic_replication_factor,
            deleting=True,
            retention=self.app.conf.reply_expires,
            value_type=ReqRepResponse,
            acks=False,
        )


class AvccApp(faust.App):
    """The faust App of an agent group."""

    #: The operator login of this worker's pages (see :mod:`app.platform.http.operators`), shared
    #: by every page so its failed-login limits hold across them; set by :func:`create_app`.
    operator_guard: OperatorGuard | None = None

    @cached_property
    def _reply_consumer(self) -> ReplyConsumer:
        return _ReplyConsumer(self, loop=self.loop, beacon=self.beacon)


def create_app(
    app_id: str,
    *,
    datadir: Path,
    web_port: int,
    reply_to: str | None = None,
    **overrides: Any,
) -> faust.App:
    """A faust App (= consumer group ``app_id``) with the pipeline's transport and settings.

    ``reply_to`` names a stable reply topic (``None``: faust's per-process one, for apps that
    ask); ``overrides`` are further faust settings (tests use a shorter commit interval). Its web
    server counts every answer in ``avcc_http_requests_total`` (:func:`count_requests`), adds the
    security headers (:func:`security_headers`) and asks for an operator login on every page that
    is not ``/v1/`` (signed) or a probe (:func:`operator_login`).
    """
    settings = get_settings()
    settings.check_bind()
    advertised = settings.advertised_url(web_port)
    guard = OperatorGuard.from_settings(settings)
    options: dict[str, Any] = {
        "broker": f"{transport.SCHEME}://{settings.kafka_bootstrap}",
        "broker_credentials": _credentials(settings),
        "store": "rocksdb://",
        "datadir": str(datadir),
        "key_serializer": "raw",
        "value_serializer": "raw",
        "autodiscover": False,
        "topic_allow_declare": False,
        "topic_disable_leader": True,
        "topic_replication_factor": settings.replication_factor,
        "producer_acks": -1,
        "consumer_auto_offset_reset": "earliest",
        "broker_session_timeout": settings.kafka_session_timeout_ms / 1000,
        "broker_heartbeat_interval": max(1.0, settings.kafka_session_timeout_ms / 5000),
        "broker_commit_every": 1000,
        "broker_commit_interval": 1.0,
        # Listen on web_host; announce the advertised URL (faust's web_host is only announced).
        "web_bind": settings.web_host,
        "web_host": urlparse(advertised).hostname,
        "web_port": web_port,
        "canonical_url": advertised,
        # faust's own /table/ and /router/ views answer without any signature: off.
        "web_tables_enabled": False,
        "web_router_enabled": False,
        "web_in_thread": False,
        "table_standby_replicas": 0,
        "stream_wait_empty": True,
        "reply_create_topic": True,
        "reply_to": reply_to,
        "producer_max_batch_size": 16384,
        "web_application_options": {"middlewares": [count_requests, security_headers, operator_login(guard)]},
        **overrides,
    }
    app = AvccApp(app_id, **options)
    app.operator_guard = guard
    transport.set_fetch_max_wait_ms(app_id, transport.EARLY_ANSWER_FETCH_MAX_WAIT_MS)
    return app


@cache
def get_app(group: str) -> faust.App:
    """The faust App of ``group`` (created once per process)."""
    settings = get_settings()
    spec = group_spec(group)
    return create_app(
        consumer_group_id(group),
        datadir=settings.resolve_data_path("workers", group),
        web_port=settings.web_port + spec.port_offset,
        # groups that never ask share one stable (idle) reply topic; askers need their own
        reply_to=None if spec.uses_replies else reply_topic(group),
    )
