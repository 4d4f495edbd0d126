"""Locally managed servers the dev stack runs (``avcc dev``): Apache Kafka in KRaft mode from its
jars, ganache for ``--chain evm``, and the process supervision they share.

The servers only tests and benches start (Kafka clusters, secured brokers, ClickHouse servers and
clusters, ZooKeeper, the ledger node, TLS material, workers as processes) are the harness of the
top-level ``testing`` package, which no product module imports.
"""

from __future__ import annotations

from app.servers.java import Java, find_java
from app.servers.kafka import (
    KAFKA_VERSION,
    KafkaKRaftBroker,
    kafka_metadata_ready,
)
from app.servers.kafka_libs import JarChecksumMismatch, ensure_kafka_libs, kafka_libs_ready
from app.servers.process import (
    LOOPBACK,
    ManagedProcess,
    ManagedServer,
    ServerNotInstalled,
    ServerStartError,
    port_is_open,
)

__all__ = [
    "KAFKA_VERSION",
    "LOOPBACK",
    "JarChecksumMismatch",
    "Java",
    "KafkaKRaftBroker",
    "ManagedProcess",
    "ManagedServer",
    "ServerNotInstalled",
    "ServerStartError",
    "ensure_kafka_libs",
    "find_java",
    "kafka_libs_ready",
    "kafka_metadata_ready",
    "port_is_open",
]
