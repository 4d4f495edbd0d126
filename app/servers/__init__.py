"""Locally managed servers (Tansu, Apache Kafka in KRaft mode, ClickHouse, the ledger node) for tests
and the dev stack."""

from __future__ import annotations

from app.servers.clickhouse import ClickHouseServer, find_clickhouse_server
from app.servers.kafka import (
    KAFKA_VERSION,
    KafkaKRaftBroker,
    ensure_kafka_libs,
    find_java,
    kafka_libs_ready,
)
from app.servers.kafka_cluster import KafkaCluster, KafkaClusterNode
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
from app.servers.tansu import TansuBroker, kafka_metadata_ready, resolve_tansu_binary

__all__ = [
    "KAFKA_VERSION",
    "LOOPBACK",
    "ClickHouseServer",
    "KafkaCluster",
    "KafkaClusterNode",
    "KafkaKRaftBroker",
    "LedgerNode",
    "ManagedProcess",
    "ManagedServer",
    "ServerNotInstalled",
    "ServerStartError",
    "TansuBroker",
    "ensure_kafka_libs",
    "find_clickhouse_server",
    "find_java",
    "free_port",
    "kafka_libs_ready",
    "kafka_metadata_ready",
    "port_is_open",
    "resolve_tansu_binary",
]
