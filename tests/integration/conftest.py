"""Session-scoped real servers (Tansu, Kafka KRaft, ClickHouse, ganache) started lazily on loopback."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from app.lifecycle.chain.keys import create_key_file
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import TOPIC_PLAN
from app.servers import (
    ClickHouseServer,
    KafkaCluster,
    KafkaKRaftBroker,
    ServerNotInstalled,
    ServerStartError,
    ensure_kafka_libs,
)
from app.servers.ganache import GanacheNode
from app.servers.tansu import TansuBroker
from tests.integration.stack import CORE_GROUPS, Stack

REPO_ROOT = Path(__file__).resolve().parents[2]


class _Server(Protocol):
    """What the fixtures start, revive and stop: a server or a cluster of them."""

    @property
    def running(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=_Server)

# Servers started in this session, so tests that kill or stop one get it revived afterwards.
_started: dict[str, _Server] = {}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _launch(name: str, factory: Callable[[], S]) -> S:
    """Build and start a server; skip (locally) or fail (CI) if it is not installed."""
    try:
        server = factory()
        server.start()
    except ServerNotInstalled as exc:
        if _in_ci():
            pytest.fail(f"{name} cannot start on this CI machine: {exc}", pytrace=False)
        pytest.skip(f"{name} is not available here: {exc}")
    except ServerStartError as exc:
        pytest.fail(f"{name} failed to start: {exc}", pytrace=False)
    _started[name] = server
    return server


def _shutdown(name: str, server: _Server) -> None:
    _started.pop(name, None)
    server.stop()


@pytest.fixture(scope="session")
def servers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Parent directory of every server's data dir and logs for this session."""
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def tansu_broker(servers_dir: Path) -> Iterator[TansuBroker]:
    """A Tansu broker (memory storage: a restart empties it) running for the whole session."""
    broker = _launch("tansu", lambda: TansuBroker(servers_dir / "tansu", die_with_parent=True))
    yield broker
    _shutdown("tansu", broker)


@pytest.fixture(scope="session")
def kafka_broker(servers_dir: Path) -> Iterator[KafkaKRaftBroker]:
    """Apache Kafka 3.9 (KRaft, single node) running for the whole session; data survives restarts."""

    def build() -> KafkaKRaftBroker:
        libs = ensure_kafka_libs()
        return KafkaKRaftBroker(servers_dir / "kafka", libs, die_with_parent=True)

    broker = _launch("kafka", build)
    yield broker
    _shutdown("kafka", broker)


@pytest.fixture(scope="session")
def clickhouse_server(servers_dir: Path) -> Iterator[ClickHouseServer]:
    """A private ClickHouse 18.16 server running for the whole session."""
    server = _launch(
        "clickhouse",
        lambda: ClickHouseServer(servers_dir / "clickhouse", die_with_parent=True),
    )
    yield server
    _shutdown("clickhouse", server)


@dataclass(frozen=True)
class EvmChain:
    """What the ``evm_chain`` fixture yields: the ganache node and its funded signing key."""

    node: GanacheNode
    key: str
    key_file: Path


@pytest.fixture(scope="session")
def evm_chain(servers_dir: Path) -> Iterator[EvmChain]:
    """A ganache EVM node mining a block a second, like a real chain (transactions wait in its
    mempool), with a persistent db (a restart keeps the chain) and one funded signing key."""
    key_file = servers_dir / "ganache-signer.key"
    key = create_key_file(key_file)
    node = _launch(
        "ganache",
        lambda: GanacheNode(
            servers_dir / "ganache", funded_keys=[key], block_time_s=1.0, die_with_parent=True
        ),
    )
    yield EvmChain(node, key, key_file)
    _shutdown("ganache", node)


@dataclass(frozen=True)
class BrokerHandle:
    """What the ``broker`` fixture yields: a name, a bootstrap address, lifecycle controls."""

    name: str
    server: TansuBroker | KafkaKRaftBroker

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients."""
        return self.server.bootstrap

    @property
    def persistent(self) -> bool:
        """Whether records and offsets survive ``restart()``/``kill()`` (Tansu memory: no)."""
        return isinstance(self.server, KafkaKRaftBroker)

    def start(self) -> None:
        """Start (no-op if running) and wait until ready."""
        self.server.start()

    def stop(self) -> None:
        """Graceful stop (SIGTERM)."""
        self.server.stop()

    def kill(self) -> None:
        """SIGKILL the broker (crash simulation)."""
        self.server.kill()

    def restart(self) -> None:
        """Graceful stop then start on the same port."""
        self.server.restart()


@pytest.fixture(params=["tansu", "kafka"], ids=["tansu", "kafka"])
def broker(request: pytest.FixtureRequest) -> BrokerHandle:
    """Each broker in turn (select with ``--brokers`` / ``$AVCC_TEST_BROKERS``)."""
    name: str = request.param
    server = request.getfixturevalue(f"{name}_broker")
    assert isinstance(server, TansuBroker | KafkaKRaftBroker)
    server.start()  # revive it if an earlier test stopped or killed it
    return BrokerHandle(name=name, server=server)


@pytest.fixture
def unique() -> str:
    """A short random suffix for topic and group names, so tests never share data."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(autouse=True)
def _revive_servers() -> Iterator[None]:
    """After each test, restart any session server the test left stopped or killed."""
    yield
    for server in list(_started.values()):
        if not server.running:
            server.start()


@pytest.fixture(scope="session", params=["tansu", "kafka"], ids=["tansu", "kafka"])
def stack_broker(request: pytest.FixtureRequest) -> Any:
    """A session broker (the same selection rules as the ``broker`` fixture)."""
    server = request.getfixturevalue(f"{request.param}_broker")
    server.start()
    return server


@pytest.fixture(scope="module")
def module_tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    """A Tansu broker of the requesting module alone, for modules that run agent-group workers:
    on the session brokers they would join the session core stack's consumer groups."""
    root = tmp_path_factory.mktemp("module-tansu")
    broker = _launch(f"tansu ({root.name})", lambda: TansuBroker(root, die_with_parent=True))
    yield broker
    _shutdown(f"tansu ({root.name})", broker)


@pytest.fixture(scope="module")
def module_kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A 3-node Apache Kafka KRaft cluster (RF 3, min.insync.replicas 2) of the requesting module
    alone; a node a test kills is restarted, data kept, after that test."""
    root = tmp_path_factory.mktemp("kafka-cluster")
    name = f"kafka cluster ({root.name})"
    cluster = _launch(name, lambda: KafkaCluster(root, ensure_kafka_libs(), die_with_parent=True))
    yield cluster
    _shutdown(name, cluster)


@pytest.fixture
def core_stack(session_core_stack: Stack) -> Stack:
    """The session's core workers, each ready (earlier tests restart brokers and kill workers)."""
    session_core_stack.wait_all_ready()
    return session_core_stack


@pytest.fixture(scope="session")
def session_core_stack(stack_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """code, review, chain and settlement workers on one broker, for the whole session."""
    root = tmp_path_factory.mktemp("core-stack")
    settings = Settings(kafka_url=f"kafka://{stack_broker.bootstrap}")
    apply_plan(settings, [*TOPIC_PLAN, *changelog_specs()])
    # a worker whose consumer stalls (seen after a broker restart) exits and is restarted
    stack = Stack(stack_broker.bootstrap, root, env={"AVCC_WORKER_STALL_S": "45"})
    stack.start(*CORE_GROUPS)
    stack.supervise()
    yield stack
    stack.stop_all()
