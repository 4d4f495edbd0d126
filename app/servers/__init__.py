"""Locally managed servers (Apache Kafka in KRaft mode, ClickHouse, the ledger node) for tests, benches
and the dev stack."""

from __future__ import annotations

from app.servers.clickhouse import ClickHouseServer, find_clickhouse_server
from app.servers.java import Java, find_java
from app.servers.kafka import (
    KAFKA_VERSION,
    KafkaKRaftBroker,
    kafka_metadata_ready,
)
from app.servers.kafka_cluster import KafkaCluster, KafkaClusterNode
from app.servers.kafka_libs import JarChecksumMismatch, ensure_kafka_libs, kafka_libs_ready
from app.servers.ledger_node import LedgerNode
from app.servers.process import (
    LOOPBACK,
    ManagedProcess,
    ManagedServer,
    ServerNotInstalled,
    ServerStartError,
    free_port,
    port_is_open,
)

__all__ = [
    "KAFKA_VERSION",
    "LOOPBACK",
    "ClickHouseServer",
    "JarChecksumMismatch",
    "Java",
    "KafkaCluster",
    "KafkaClusterNode",
    "KafkaKRaftBroker",
    "LedgerNode",
    "ManagedProcess",
    "ManagedServer",
    "ServerNotInstalled",
    "ServerStartError",
    "ensure_kafka_libs",
    "find_clickhouse_server",
    "find_java",
    "free_port",
    "kafka_libs_ready",
    "kafka_metadata_ready",
    "port_is_open",
]
