"""Single-node Apache Kafka 3.9 in KRaft mode (combined broker + controller) run from Maven jars."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path

from app.servers.process import (
    LOOPBACK,
    ManagedServer,
    ServerNotInstalled,
    ServerStartError,
    free_port,
)
from app.servers.tansu import kafka_metadata_ready

__all__ = [
    "KAFKA_VERSION",
    "KafkaKRaftBroker",
    "ensure_kafka_libs",
    "find_java",
    "kafka_libs_ready",
    "new_cluster_id",
]

KAFKA_VERSION = "3.9.1"
_KAFKA_JAR = f"kafka_2.13-{KAFKA_VERSION}.jar"
_STAMP = ".pom.sha256"
_MVN_TIMEOUT = 900.0

_DEFAULT_HEAP = ("-Xmx768m", "-Xms256m")
_JVM_OPTS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def kafka_libs_ready(repo_root: Path) -> bool:
    """True when ``deploy/kafka/libs`` holds a complete copy made from the current pom.xml."""
    deploy = Path(repo_root) / "deploy" / "kafka"
    libs = deploy / "libs"
    stamp = libs / _STAMP
    try:
        return (libs / _KAFKA_JAR).is_file() and stamp.read_text().strip() == _pom_digest(deploy / "pom.xml")
    except OSError:
        return False


def ensure_kafka_libs(repo_root: Path) -> Path:
    """Return ``deploy/kafka/libs``, fetching the jars with Maven first if missing or stale.

    The copy goes to a temporary directory and is renamed into place, and a stamp holding the
    pom.xml digest marks it complete, so an interrupted download is retried on the next call.
    A file lock serialises concurrent callers.
    """
    deploy = Path(repo_root).resolve() / "deploy" / "kafka"
    libs = deploy / "libs"
    pom = deploy / "pom.xml"
    if kafka_libs_ready(repo_root):
        return libs
    if not pom.is_file():
        raise ServerNotInstalled(f"kafka: {pom} is missing")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServerNotInstalled("kafka: jars missing in deploy/kafka/libs and Maven (mvn) is not installed")
    lock_name = f"avcc-kafka-libs-{hashlib.sha256(str(deploy).encode()).hexdigest()[:12]}.lock"
    with (Path(tempfile.gettempdir()) / lock_name).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if kafka_libs_ready(repo_root):
            return libs
        staging = deploy / f".libs.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=_MVN_TIMEOUT, check=False)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ServerNotInstalled(f"kafka: Maven did not finish within {_MVN_TIMEOUT:.0f}s") from exc
        if done.returncode != 0 or not (staging / _KAFKA_JAR).is_file():
            shutil.rmtree(staging, ignore_errors=True)
            output = (done.stdout + done.stderr)[-3000:]
            raise ServerNotInstalled(f"kafka: fetching jars with Maven failed ({' '.join(cmd)}):\n{output}")
        (staging / _STAMP).write_text(_pom_digest(pom) + "\n")
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
    return libs


def find_java() -> str:
    """The ``java`` executable: ``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise ServerNotInstalled("kafka: no Java runtime (java) on PATH and JAVA_HOME is not set")
    return java


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

    The storage is formatted once; ``restart()``/``kill()`` + ``start()`` keep the log
    directory, so records and committed offsets survive. The JVM's log4j output goes to
    ``data_dir/kafka.log``.
    """

    name = "kafka"

    def __init__(
        self,
        data_dir: Path,
        libs_dir: Path,
        port: int | None = None,
        controller_port: int | None = None,
        *,
        extra_properties: Mapping[str, str] | None = None,
        heap: tuple[str, ...] = _DEFAULT_HEAP,
        ready_timeout: float = 90.0,
        stop_timeout: float = 30.0,
        die_with_parent: bool = False,
    ) -> None:
        super().__init__(
            data_dir, ready_timeout=ready_timeout, stop_timeout=stop_timeout, die_with_parent=die_with_parent
        )
        self.libs_dir = Path(libs_dir).resolve()
        self.port = port if port is not None else free_port()
        self.controller_port = controller_port if controller_port is not None else free_port()
        self.extra_properties = dict(extra_properties or {})
        self.heap = heap
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
        if not self.libs_dir.is_dir() or not any(self.libs_dir.glob("kafka_2.13-*.jar")):
            raise ServerNotInstalled(f"kafka: no Kafka jars in {self.libs_dir} (run ensure_kafka_libs)")
        return [
            find_java(),
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
        ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, check=False, cwd=self.data_dir
        )
        with self.log_path.open("a") as log:
            log.write(f"=== storage format: {' '.join(cmd)}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            raise ServerStartError(f"kafka: storage format failed:\n{done.stdout}{done.stderr}")

    def _command(self) -> list[str]:
        return [*self._java_base(), "kafka.Kafka", str(self.config_path)]

    def _probe(self) -> bool:
        return kafka_metadata_ready(self.bootstrap, require_leaders=True)
