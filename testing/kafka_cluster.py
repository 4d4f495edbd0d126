"""A multi-node Apache Kafka KRaft cluster (combined broker + controller nodes) on loopback.

Every node is a :class:`~app.servers.kafka.KafkaKRaftBroker` with its own ports and data
directory, formatted with one shared cluster id and one static controller quorum, so a node can be
SIGKILLed and restarted with its log kept while the others go on (a quorum of 2 of 3 stays up).
Topics are replicated ``replication_factor`` times with ``min.insync.replicas`` (defaults 3 and 2):
an ``acks=all`` write survives the loss of any one node.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from confluent_kafka.admin import AdminClient

from app.servers.kafka import KafkaKRaftBroker, new_cluster_id
from app.servers.kafka_libs import ensure_kafka_libs
from app.servers.process import LOOPBACK, port_is_open
from testing.ports import free_port
from testing.processes import stop_together

__all__ = ["KafkaCluster", "KafkaClusterNode"]

#: Heap of one node: three of them share a small CI machine with the workers under test.
_NODE_HEAP = ("-Xmx320m", "-Xms128m")


class KafkaClusterNode(KafkaKRaftBroker):
    """One node of a :class:`KafkaCluster`: ``node.id`` ``node_id``, voter of ``voters``."""

    def __init__(
        self,
        data_dir: Path,
        libs_dir: Path | None,
        *,
        node_id: int,
        voters: str,
        cluster_id: str,
        port: int,
        controller_port: int,
        cluster_properties: Mapping[str, str],
        die_with_parent: bool = False,
    ) -> None:
        super().__init__(
            data_dir,
            libs_dir,
            port=port,
            controller_port=controller_port,
            extra_properties=cluster_properties,
            heap=_NODE_HEAP,
            ready_timeout=150.0,
            die_with_parent=die_with_parent,
        )
        self.node_id = node_id
        self.voters = voters
        self.cluster_id = cluster_id

    def properties(self) -> dict[str, str]:
        """The single-node configuration with this node's id and the cluster's quorum."""
        return {
            **super().properties(),
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
        }

    def _probe(self) -> bool:
        """Ready once this node is registered: its own metadata lists it among the brokers."""
        if not port_is_open(LOOPBACK, self.port):
            return False
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0, "socket.timeout.ms": 2000})
        metadata = admin.list_topics(timeout=2.0)
        return self.node_id in metadata.brokers


class KafkaCluster:
    """``size`` Kafka nodes forming one KRaft cluster; data under ``root/node-<id>``; the jars of
    ``libs_dir``, by default the cached set of :func:`~app.servers.kafka_libs.ensure_kafka_libs`."""

    def __init__(
        self,
        root: Path,
        libs_dir: Path | None = None,
        *,
        size: int = 3,
        replication_factor: int = 3,
        min_insync_replicas: int = 2,
        die_with_parent: bool = False,
    ) -> None:
        self.root = Path(root).resolve()
        libs_dir = libs_dir if libs_dir is not None else ensure_kafka_libs()
        self.replication_factor = replication_factor
        self.min_insync_replicas = min_insync_replicas
        ids = range(1, size + 1)
        ports = {i: (free_port(), free_port()) for i in ids}
        voters = ",".join(f"{i}@{LOOPBACK}:{ports[i][1]}" for i in ids)
        shared = new_cluster_id()
        props = self.cluster_properties()
        self.nodes: dict[int, KafkaClusterNode] = {
            i: KafkaClusterNode(
                self.root / f"node-{i}",
                libs_dir,
                node_id=i,
                voters=voters,
                cluster_id=shared,
                port=ports[i][0],
                controller_port=ports[i][1],
                cluster_properties=props,
                die_with_parent=die_with_parent,
            )
            for i in ids
        }

    def cluster_properties(self) -> dict[str, str]:
        """Replication settings every node shares (internal topics included)."""
        rf, isr = str(self.replication_factor), str(self.min_insync_replicas)
        return {
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "6",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "3",
            "unclean.leader.election.enable": "false",
            "replica.lag.time.max.ms": "10000",
            "num.replica.fetchers": "1",
            "num.io.threads": "2",
        }

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` naming every node."""
        return ",".join(node.bootstrap for node in self.nodes.values())

    @property
    def running(self) -> bool:
        """True while every node runs."""
        return all(node.running for node in self.nodes.values())

    def node(self, node_id: int) -> KafkaClusterNode:
        """The node with ``node.id`` ``node_id``."""
        return self.nodes[node_id]

    def start(self) -> None:
        """Start every stopped node together (a quorum needs a majority) and wait for each."""
        stopped = [node for node in self.nodes.values() if not node.running]
        for node in stopped:
            node.start(wait=False)
        try:
            for node in stopped:
                node.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every node at once (SIGTERM, then SIGKILL after its stop timeout); data is kept."""
        stop_together(self.nodes.values())

    def fully_in_sync(self, topic: str, timeout: float = 10.0) -> bool:
        """Whether every partition of ``topic`` has all its replicas in sync (a restarted node
        has caught up)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        meta = admin.list_topics(topic=topic, timeout=timeout).topics[topic]
        return all(len(p.isrs) == len(p.replicas) for p in meta.partitions.values())

    def leader_of(self, topic: str, partition: int, timeout: float = 10.0) -> int:
        """``node.id`` of the current leader of ``topic[partition]`` (-1 while it has none)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        meta = admin.list_topics(topic=topic, timeout=timeout).topics[topic]
        return int(meta.partitions[partition].leader)
