"""A replicated, sharded ClickHouse cluster on loopback: ZooKeeper and shards x replicas servers.

Every member is a :class:`~testing.clickhouse.ClickHouseServer` (Debian's 18.16 here) with its
own ports and data directory, the cluster in its ``remote_servers`` (internal replication: a
``Distributed`` insert goes to one replica of each shard, replication copies it), its
``{shard}``/``{replica}`` macros and the distributed DDL queue, so ``ON CLUSTER`` DDL and
``Replicated*MergeTree`` tables work as in production. Any member can be SIGKILLed and restarted
on its data; ZooKeeper (:class:`~testing.zookeeper.ZooKeeperServer`) too.
"""

from __future__ import annotations

from pathlib import Path

from app.servers.process import LOOPBACK
from testing.clickhouse import ClickHouseServer
from testing.ports import free_port
from testing.processes import stop_together
from testing.zookeeper import ZooKeeperServer

__all__ = ["ClickHouseCluster"]


class ClickHouseCluster:
    """``shards`` x ``replicas`` ClickHouse servers named ``name`` in their config, one ZooKeeper."""

    def __init__(
        self,
        root: Path,
        libs_dir: Path | None = None,
        *,
        name: str = "avcc",
        shards: int = 2,
        replicas: int = 2,
        die_with_parent: bool = False,
    ) -> None:
        self.root = Path(root).resolve()
        self.name = name
        self.zookeeper = ZooKeeperServer(self.root / "zookeeper", libs_dir, die_with_parent=die_with_parent)
        ports = [[(free_port(), free_port(), free_port()) for _ in range(replicas)] for _ in range(shards)]
        remote = self._remote_servers([[tcp for tcp, _, _ in shard] for shard in ports])
        self.nodes: list[list[ClickHouseServer]] = []
        for shard, members in enumerate(ports, start=1):
            row: list[ClickHouseServer] = []
            for replica, (tcp, http, interserver) in enumerate(members, start=1):
                extra = (
                    remote
                    + self._zookeeper_config()
                    + f"    <macros><shard>{shard:02d}</shard>"
                    + f"<replica>s{shard}r{replica}</replica></macros>\n"
                    + "    <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>\n"
                    + f"    <interserver_http_port>{interserver}</interserver_http_port>\n"
                    + f"    <interserver_http_host>{LOOPBACK}</interserver_http_host>\n"
                )
                row.append(
                    ClickHouseServer(
                        self.root / f"s{shard}r{replica}",
                        tcp,
                        http,
                        extra_config=extra,
                        die_with_parent=die_with_parent,
                    )
                )
            self.nodes.append(row)

    def _remote_servers(self, tcp_ports: list[list[int]]) -> str:
        shards = "".join(
            "            <shard><internal_replication>true</internal_replication>"
            + "".join(f"<replica><host>{LOOPBACK}</host><port>{p}</port></replica>" for p in ports)
            + "</shard>\n"
            for ports in tcp_ports
        )
        cluster = f"        <{self.name}>\n{shards}        </{self.name}>\n"
        return f"    <remote_servers>\n{cluster}    </remote_servers>\n"

    def _zookeeper_config(self) -> str:
        host, port = self.zookeeper.address
        return (
            f"    <zookeeper><node><host>{host}</host><port>{port}</port></node>"
            "<session_timeout_ms>6000</session_timeout_ms></zookeeper>\n"
        )

    @property
    def members(self) -> list[ClickHouseServer]:
        """Every server, shard by shard."""
        return [node for row in self.nodes for node in row]

    @property
    def url(self) -> str:
        """The URL of the first member (any member can run ``ON CLUSTER`` DDL and read the
        ``Distributed`` tables)."""
        return self.nodes[0][0].url

    @property
    def running(self) -> bool:
        """True while ZooKeeper and every member run."""
        return self.zookeeper.running and all(node.running for node in self.members)

    def start(self) -> None:
        """Start ZooKeeper, then every member (no-op for those already running)."""
        self.zookeeper.start()
        for node in self.members:
            node.start(wait=False)
        for node in self.members:
            node.wait_ready()

    def stop(self) -> None:
        """Stop every member at once, then ZooKeeper; data is kept."""
        stop_together(self.members)
        self.zookeeper.stop()
