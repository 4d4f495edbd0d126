"""Builds the faust App of an agent group; every other module gets its App from here."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import threading
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import faust

from app.platform.faust.recovery import AvccTable, TableRecovery, stop_status
from app.platform.groups import group_spec
from app.platform.http.counting import count_requests
from app.platform.http.headers import security_headers
from app.platform.http.operators import OperatorGuard, operator_login
from app.platform.settings import Settings, get_settings
from app.platform.topics import reply_topic

__all__ = ["AvccApp", "AvccWorker", "consumer_group_id", "create_app", "get_app"]

log = logging.getLogger(__name__)


#: How often a worker flushes its tables' stores out of RocksDB's write-ahead log.
TABLE_FLUSH_INTERVAL_S = 60.0


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


class AvccWorker(faust.Worker):
    """faust's worker without its terminal spinner.

    At log level WARN and above faust adds a spinner handler to the root logger and lowers the
    root logger to DEBUG, so every debug call of every library (aiokafka logs each partition of
    each fetch) built a log record nobody printed: 6 % of a code worker's CPU at 100
    applications/s. Workers log to files and pods, where a spinner shows nothing anyway.
    """

    def on_setup_root_logger(self, logger: Any, level: int) -> None:
        """faust's hook, with the spinner turned off first."""
        self.spinner = None
        super().on_setup_root_logger(logger, level)

    async def on_stop(self) -> None:
        """Arm the stop deadline (``AVCC_WORKER_STOP_S``), then stop as faust does.

        With its broker gone, faust's stop waits 60 s for its consumer thread, longer than
        Kubernetes' grace period: the kubelet then kills the worker anyway. Past the deadline the
        worker exits itself, with the status it would have stopped with. Nothing is lost: offsets
        are committed only after their effects are durable, so what was not committed is
        processed again (and deduplicated).
        """
        deadline = get_settings().worker_stop_s
        timer = threading.Timer(deadline, self._stop_overdue, args=(deadline,))
        timer.daemon = True
        timer.start()
        await super().on_stop()

    def _stop_overdue(self, deadline: float) -> None:
        status = stop_status(self.app)
        log.critical(
            "the worker did not stop within %.0f s (its broker gone?): exiting now with status %d; "
            "what was not committed is processed again",
            deadline,
            status,
        )
        logging.shutdown()
        os._exit(status)


class AvccApp(faust.App):
    """The faust App of an agent group."""

    #: The operator login of this worker's pages (see :mod:`app.platform.http.operators`), shared
    #: by every page so its failed-login limits hold across them; set by :func:`create_app`.
    operator_guard: OperatorGuard | None = None
    #: The project's recovery of this App's tables (:mod:`app.platform.faust.recovery`).
    table_recovery: TableRecovery | None = None

    async def on_stop(self) -> None:
        """The table recovery's reader first (it writes into the stores faust is about to
        close), then faust's stop."""
        if self.table_recovery is not None:
            await asyncio.to_thread(self.table_recovery.close)
        await super().on_stop()


def create_app(
    app_id: str,
    *,
    datadir: Path,
    web_port: int,
    reply_to: str | None = None,
    **overrides: Any,
) -> faust.App:
    """A faust App (= consumer group ``app_id``) with the pipeline's settings.

    ``reply_to`` names the stable reply topic of the group (no agent here asks, so nothing
    subscribes it; ``None``: faust's per-process one); ``overrides`` are further faust settings. Its web
    server counts every answer in ``avcc_http_requests_total`` (:func:`count_requests`), adds the
    security headers (:func:`security_headers`) and asks for an operator login on every page that
    is not ``/v1/`` (signed) or a probe (:func:`operator_login`).
    """
    settings = get_settings()
    settings.check_bind()
    advertised = settings.advertised_url(web_port)
    guard = OperatorGuard.from_settings(settings)
    options: dict[str, Any] = {
        "broker": f"kafka://{settings.kafka_bootstrap}",
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
        "table_standby_replicas": settings.table_standby_replicas,
        "Table": AvccTable,
        "consumer_group_instance_id": settings.kafka_group_instance_id,
        "stream_wait_empty": True,
        # No agent asks (faust's ask/reply), so nothing reads replies: faust's reply consumer,
        # started with reply_create_topic, only subscribed the empty topic and slept 3 s.
        "reply_create_topic": False,
        "reply_to": reply_to,
        "Worker": AvccWorker,
        "web_application_options": {"middlewares": [count_requests, security_headers, operator_login(guard)]},
        **overrides,
    }
    app = AvccApp(app_id, **options)
    app.operator_guard = guard
    recovery = app.table_recovery = TableRecovery(app, settings)

    async def flush_tables() -> None:
        await asyncio.to_thread(recovery.flush)

    # what a SIGKILL leaves in RocksDB's write-ahead log is at most this much of the tables' writes
    app.timer(interval=TABLE_FLUSH_INTERVAL_S, name=f"{app_id}-flush-tables")(flush_tables)
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
        reply_to=reply_topic(group),
    )
