"""Real servers (Apache Kafka in KRaft mode, ClickHouse, ganache) started lazily on loopback.

Who owns what (so any module passes alone and in any order):

* ``kafka_broker`` / ``broker``: one broker for the session, for modules that only create
  uuid-named topics and groups on it; nobody stops or restarts it.
* ``session_core_stack`` / ``core_stack``: code, review, chain and settlement workers on that
  broker, shared by modules that only send them new applications and read their own records
  (``test_lifecycle``, ``test_api_fuzz``, ``test_partner_client``); nobody stops, kills or
  replays into it.
* ``module_kafka``, ``module_kafka_cluster``, ``clickhouse_server``, ``evm_chain``: one per
  module that asks, stopped at its end; a module may kill or restart its own.

A session fixture is stopped right after the last test that uses it, not at the end of the
session (:func:`pytest_runtest_teardown`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from app.lifecycle.chain.keys import create_key_file
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import TOPIC_PLAN
from app.servers import KafkaKRaftBroker, ServerNotInstalled, ServerStartError, ensure_kafka_libs
from app.servers.ganache import GanacheNode
from testing.clickhouse import ClickHouseServer
from testing.clickhouse_cluster import ClickHouseCluster
from testing.kafka_cluster import KafkaCluster
from testing.kafka_secure import KafkaSecureBroker
from testing.ports import free_port, free_port_block
from tests.figures import Report, reporter
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
def kafka_broker(servers_dir: Path) -> Iterator[KafkaKRaftBroker]:
    """Apache Kafka 3.9 (KRaft, single node) running for the whole session; data survives restarts."""
    broker = _launch(
        "kafka",
        lambda: KafkaKRaftBroker(
            servers_dir / "kafka", ensure_kafka_libs(), port=free_port_block((0, 1)), die_with_parent=True
        ),
    )
    _stop_after_last_user["kafka_broker"] = lambda: _shutdown("kafka", broker)
    yield broker
    if broker.running:
        _shutdown("kafka", broker)


@pytest.fixture(scope="module")
def clickhouse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    """A private ClickHouse 18.16 server of the requesting module (which may stop and restart it)."""
    root = tmp_path_factory.mktemp("clickhouse")
    name = f"clickhouse ({root.name})"
    server = _launch(name, lambda: ClickHouseServer(root, die_with_parent=True))
    yield server
    _shutdown(name, server)


@dataclass(frozen=True)
class EvmChain:
    """What the ``evm_chain`` fixture yields: the ganache node and its funded signing key."""

    node: GanacheNode
    key: str
    key_file: Path


@pytest.fixture(scope="module")
def evm_chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvmChain]:
    """A ganache EVM node of the requesting module mining a block a second, like a real chain
    (transactions wait in its mempool), with a persistent db (a restart keeps the chain) and one
    funded signing key."""
    root = tmp_path_factory.mktemp("ganache")
    key_file = root / "ganache-signer.key"
    key = create_key_file(key_file)
    name = f"ganache ({root.name})"
    node = _launch(
        name,
        lambda: GanacheNode(
            root / "node", port=free_port(), funded_keys=[key], block_time_s=1.0, die_with_parent=True
        ),
    )
    yield EvmChain(node, key, key_file)
    _shutdown(name, node)


@pytest.fixture
def broker(kafka_broker: KafkaKRaftBroker) -> KafkaKRaftBroker:
    """The session's Kafka broker (running: nothing stops it while a test still needs it)."""
    kafka_broker.start()
    return kafka_broker


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Report:
    """Reports a figure (counts, times) of the test for the CI log's summary."""
    return reporter(request.config, request.node.name)


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


@pytest.fixture(scope="session")
def stack_broker(kafka_broker: KafkaKRaftBroker) -> KafkaKRaftBroker:
    """The session broker the session's core stack runs on, with the topic plan and changelogs
    made: whichever module starts workers on it first (an api_fuzz sink once found its topics
    missing and never got ready, when it ran before any core stack)."""
    kafka_broker.start()
    apply_plan(Settings(kafka_url=f"kafka://{kafka_broker.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    return kafka_broker


def _private_broker(root: Path) -> tuple[str, KafkaKRaftBroker]:
    """A broker of one module or test, started, on its data in ``root``: its name and itself."""
    name = f"kafka ({root.name})"
    broker = _launch(
        name,
        lambda: KafkaKRaftBroker(
            root, ensure_kafka_libs(), port=free_port_block((0, 1)), die_with_parent=True
        ),
    )
    return name, broker


@pytest.fixture(scope="module")
def module_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaKRaftBroker]:
    """A Kafka broker of the requesting module alone, for modules that run agent-group workers:
    on the session broker they would join the session core stack's consumer groups."""
    name, broker = _private_broker(tmp_path_factory.mktemp("module-kafka"))
    yield broker
    _shutdown(name, broker)


@pytest.fixture
def own_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaKRaftBroker]:
    """A Kafka broker of the requesting test alone, with the plan's topics: for a test whose
    workers run as in production (the plan's topics, the group's own consumer group)."""
    name, broker = _private_broker(tmp_path_factory.mktemp("own-kafka"))
    apply_plan(Settings(kafka_url=f"kafka://{broker.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    yield broker
    _shutdown(name, broker)


@pytest.fixture(scope="module")
def module_clickhouse_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseCluster]:
    """2 shards x 2 replicas of ClickHouse 18.16 and a ZooKeeper (from the Kafka jars), named
    ``avcc`` in their config, of the requesting module; a member a test kills is its to restart."""
    root = tmp_path_factory.mktemp("clickhouse-cluster")
    name = f"clickhouse cluster ({root.name})"
    cluster = _launch(name, lambda: ClickHouseCluster(root, ensure_kafka_libs(), die_with_parent=True))
    yield cluster
    _shutdown(name, cluster)


@pytest.fixture(scope="module")
def module_secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaSecureBroker]:
    """A Kafka broker of the requesting module that requires SASL_SSL (SCRAM-SHA-512, a CA of its
    own) and authorizes every request by ACL; ``admin`` is its only client super user."""
    root = tmp_path_factory.mktemp("kafka-secure")
    name = f"secure kafka ({root.name})"
    broker = _launch(
        name,
        lambda: KafkaSecureBroker(
            root, ensure_kafka_libs(), port=free_port_block((0, 1)), die_with_parent=True
        ),
    )
    yield broker
    _shutdown(name, broker)


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
    """The session's core workers, each ready (a worker the stall watchdog restarted is back)."""
    session_core_stack.wait_all_ready()
    return session_core_stack


@pytest.fixture(scope="session")
def session_core_stack(
    stack_broker: KafkaKRaftBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """code, review, chain and settlement workers on one broker, for the whole session."""
    root = tmp_path_factory.mktemp("core-stack")
    settings = Settings(kafka_url=f"kafka://{stack_broker.bootstrap}")
    apply_plan(settings, [*TOPIC_PLAN, *changelog_specs()])
    # a worker whose consumer stalls (seen after a broker restart) exits and is restarted
    stack = Stack(stack_broker.bootstrap, root, env={"AVCC_WORKER_STALL_S": "45"})
    stack.start(*CORE_GROUPS)
    stack.supervise()
    _stop_after_last_user["session_core_stack"] = stack.stop_all
    yield stack
    stack.stop_all()


#: Session fixtures to stop once no test left to run uses them: fixture name -> how to stop it.
_stop_after_last_user: dict[str, Callable[[], None]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop a session fixture's servers after the last test that uses it (in the order this run
    goes, random or not), so they do not take memory and CPU from the modules after it."""
    yield
    if not _stop_after_last_user:
        return
    items = item.session.items
    later = items[items.index(item) + 1 :] if nextitem is not None else []
    needed = {name for later_item in later for name in getattr(later_item, "fixturenames", ())}
    for name in reversed([n for n in _stop_after_last_user if n not in needed]):  # stacks first
        _stop_after_last_user.pop(name)()
