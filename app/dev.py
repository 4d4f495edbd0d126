"""The local all-in-one stack: embedded Apache Kafka, chDB, the topic plan and every agent group.

DEV ONLY: a single-node Kafka (KRaft) keeps its data under ``<data dir>/kafka``, so a restarted
stack finds its topics, offsets and changelogs again; the shipped HMAC key ``dev``/``dev-secret``
and operator ``admin``/``admin`` are enabled, and a broker that cannot honour the core producer
profile is only warned about.

Supervision (``app/supervisor``): every port the stack listens on is in its port plan
(:func:`port_plan`: the broker, its KRaft controller on the next port, each group's web port, the
dev chain), checked before anything starts and named in the banner (exit status 2 naming a port
planned twice, or a taken port and its holder); the workers' tables must belong to the broker's
data (exit status 3 saying what to delete, see ``broker_identity``); a group that exits is
restarted with exponential backoff and never stops the others; so is the broker, on its own data.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import time
from types import FrameType

from confluent_kafka import KafkaException

from app.dev_broker import describe_dev_broker, dev_broker_port, dev_controller_port, start_dev_broker
from app.dev_chain import DevChain, dev_chain_port, start_dev_chain
from app.platform.groups import GROUPS, GroupSpec
from app.platform.kafka.admin import apply_plan
from app.platform.kafka.clients import admin_client
from app.platform.redaction import redact_url
from app.platform.settings import Settings, get_settings
from app.servers.kafka import KafkaKRaftBroker
from app.servers.process import LOOPBACK, ServerStartError
from app.supervisor import (
    BrokerSupervisor,
    GroupSupervisor,
    PortClaim,
    PortInUse,
    PortPlan,
    PortPlanConflict,
    TablesFromAnotherBroker,
    check_tables_belong_to,
)
from app.supervisor.settings import get_supervisor_settings

__all__ = ["EXIT_BROKER_LOST", "EXIT_PORT_IN_USE", "EXIT_TABLES_FROM_ANOTHER_BROKER", "run_dev_stack"]

#: Exit status of ``avcc dev`` when a port it needs is taken (nothing was started).
EXIT_PORT_IN_USE = 2
#: Exit status when the embedded broker failed to start (or the given one does not answer).
EXIT_BROKER_LOST = 1
#: Exit status when the workers' tables were built on another broker's data (no worker started).
EXIT_TABLES_FROM_ANOTHER_BROKER = 3

log = logging.getLogger("avcc.dev")

BANNER = """
==============================================================================
 AVCC dev stack — DEV ONLY
   * {broker}
   * ClickHouse: {clickhouse}
   * chain: {chain}
   * HMAC API key 'dev' / secret 'dev-secret' is ENABLED (never use outside dev)
   * operator console login admin / admin
 Console: http://{host}:{port}/dlq   lag: http://{host}:{port}/lag
 Apply:   POST http://{host}:{code_port}/v1/avcc/applications
 Ports (the stack's port plan, checked before it started):
{ports}
==============================================================================
"""


def available_groups(wanted: list[str] | None) -> list[GroupSpec]:
    """Groups whose agent module exists (optionally only those named)."""
    found = [g for g in GROUPS if importlib.util.find_spec(g.module) is not None]
    if wanted:
        unknown = set(wanted) - {g.name for g in GROUPS}
        if unknown:
            raise SystemExit(f"unknown groups: {', '.join(sorted(unknown))}")
        found = [g for g in found if g.name in wanted]
    return found


def _child_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["AVCC_DEV_MODE"] = "true"
    env["AVCC_DATA_DIR"] = str(settings.data_dir.resolve())
    env.setdefault("AVCC_KAFKA_URL", settings.kafka_url)
    return env


def run_dev_stack(wanted: list[str] | None = None, *, start_broker: bool = True, chain: str = "local") -> int:
    """Start everything, wait for Ctrl-C/SIGTERM, then stop everything. Returns an exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ["AVCC_DEV_MODE"] = "true"
    get_settings.cache_clear()
    settings = get_settings()
    settings.check_bind()
    groups = available_groups(wanted)
    try:
        plan = port_plan(settings, groups, start_broker=start_broker, chain=chain)
        plan.check()
    except (PortInUse, PortPlanConflict) as exc:
        log.error("avcc dev cannot start: %s", exc)
        return EXIT_PORT_IN_USE
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    policy = get_supervisor_settings().policy()
    broker: KafkaKRaftBroker | None = None
    broker_supervisor: BrokerSupervisor | None = None
    dev_chain: DevChain | None = None
    supervisor: GroupSupervisor | None = None
    stopping = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        if start_broker:
            try:
                broker = start_dev_broker(settings, data_dir)
            except ServerStartError as exc:
                log.error("avcc dev cannot start its broker: %s", exc)
                return EXIT_BROKER_LOST
            log.info("%s (pid %s)", describe_dev_broker(broker), broker.pid)
            broker_supervisor = BrokerSupervisor(broker, policy=policy)
        try:
            cluster_id = _cluster_id(settings, broker)
        except KafkaException as exc:
            log.error(
                "avcc dev cannot ask the broker at %s for its cluster id: %s", settings.kafka_bootstrap, exc
            )
            return EXIT_BROKER_LOST
        try:
            check_tables_belong_to(data_dir / "workers", cluster_id)
        except TablesFromAnotherBroker as exc:
            log.error("avcc dev cannot start its groups: %s", exc)
            return EXIT_TABLES_FROM_ANOTHER_BROKER
        if stopping:  # Ctrl-C while the broker started
            return 0
        if chain == "evm":
            dev_chain = start_dev_chain(data_dir, dev_chain_port(settings))
            log.info("ganache dev chain on %s, AvccRegistry at %s", dev_chain.node.url, dev_chain.env)
        report = apply_plan(settings)
        for name in report.created:
            log.info("created topic %s", name)
        for drift in report.unfixed:
            log.error("topic drift: %s", drift.line())
        env = {**_child_env(settings), **(dev_chain.env if dev_chain else {})}
        supervisor = GroupSupervisor(
            groups,
            env=env,
            logs=data_dir / "logs",
            policy=policy,
            web_port=lambda group: settings.web_port + group.port_offset,
        )
        supervisor.start_all()
        print(
            BANNER.format(
                broker=describe_dev_broker(broker) if broker else f"broker: {settings.kafka_bootstrap}",
                clickhouse=redact_url(settings.clickhouse_url),
                chain=redact_url(env.get("AVCC_CHAIN_URL", settings.chain_url)),
                host=settings.web_host,
                port=settings.web_port,
                code_port=settings.web_port + 1,
                ports=plan.describe(),
            ),
            flush=True,
        )
        while not stopping:
            if broker_supervisor is not None:
                broker_supervisor.tick()
            supervisor.tick()
            time.sleep(0.5)
        return 0
    finally:
        if supervisor is not None:
            supervisor.stop()
        if broker is not None:
            broker.stop()
        if broker_supervisor is not None and broker_supervisor.restarts:
            log.info("broker restarts while the stack ran: %d", broker_supervisor.restarts)
        if dev_chain is not None:
            dev_chain.stop()
        log.info("dev stack stopped")


def port_plan(settings: Settings, groups: list[GroupSpec], *, start_broker: bool, chain: str) -> PortPlan:
    """Every port the stack will listen on: the embedded broker's and its KRaft controller's (the
    broker's + 1), each group's web port (``AVCC_WEB_PORT`` + the group's offset) and the dev
    chain's; nothing of the stack listens anywhere else."""
    claims: list[PortClaim] = []
    if start_broker:
        claims.append(PortClaim("the embedded Kafka broker", LOOPBACK, dev_broker_port(settings)))
        claims.append(
            PortClaim("the embedded Kafka broker's KRaft controller", LOOPBACK, dev_controller_port(settings))
        )
    claims.extend(
        PortClaim(f"the web server of group {g.name}", settings.web_host, settings.web_port + g.port_offset)
        for g in groups
    )
    if chain == "evm":
        claims.append(PortClaim("the ganache dev chain", LOOPBACK, dev_chain_port(settings)))
    return PortPlan(tuple(claims))


def _cluster_id(settings: Settings, broker: KafkaKRaftBroker | None) -> str:
    """The Kafka cluster id of the stack's broker (its own, or asked of ``AVCC_KAFKA_URL``)."""
    if broker is not None and broker.cluster_id:
        return broker.cluster_id
    return str(admin_client(settings, log_level=0).list_topics(timeout=30).cluster_id)
