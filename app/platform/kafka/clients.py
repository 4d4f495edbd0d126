"""The one place that builds confluent-kafka client configurations from the settings.

Every consumer, producer and admin client of the pipeline (outside faust's own aiokafka
clients, configured in :mod:`app.platform.faust.app`) gets its configuration here, so that
connection and security settings, the heartbeat formula and the producer profiles are written
once:

* :func:`consumer_config` — a manually committing consumer of one group;
* :func:`producer_config` / :func:`verified_producer` — a producer of one profile (seed 9.3.1);
* :func:`admin_client` — an admin client.
"""

from __future__ import annotations

from typing import Any, Literal

from confluent_kafka.admin import AdminClient

from app.platform.kafka.producers import EventProducer, profile_config
from app.platform.settings import Settings
from app.platform.topics import ProducerProfile

__all__ = [
    "AssignmentStrategy",
    "admin_client",
    "consumer_config",
    "heartbeat_interval_ms",
    "producer_config",
    "verified_producer",
]

#: ``range`` keeps co-partitioned topics together; ``roundrobin`` spreads one topic evenly.
AssignmentStrategy = Literal["range", "roundrobin"]


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """Heartbeat interval for a session timeout: a third of it, between 100 ms and 3 s.

    Three heartbeats fit in a session, so one lost heartbeat never expires a member, and the
    3 s cap (Kafka's default) keeps long sessions from slowing rebalances down.
    """
    return max(100, min(3000, session_timeout_ms // 3))


def consumer_config(
    settings: Settings,
    group_id: str,
    client_id: str,
    *,
    auto_offset_reset: Literal["earliest", "latest"] = "earliest",
    assignment_strategy: AssignmentStrategy = "range",
    **overrides: Any,
) -> dict[str, Any]:
    """librdkafka configuration of a consumer that stores and commits offsets itself.

    Offsets are never committed automatically (a consumer commits only after its effects are
    durable); ``overrides`` adds or replaces librdkafka settings (prefetch bounds, fetch wait).
    """
    session_ms = settings.kafka_session_timeout_ms
    conf: dict[str, Any] = {
        **settings.kafka_client_config(),
        "group.id": group_id,
        "client.id": client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": auto_offset_reset,
        "partition.assignment.strategy": assignment_strategy,
        "session.timeout.ms": session_ms,
        "heartbeat.interval.ms": heartbeat_interval_ms(session_ms),
    }
    conf.update(overrides)
    return conf


def producer_config(
    settings: Settings, profile: ProducerProfile, client_id: str, **overrides: Any
) -> dict[str, Any]:
    """librdkafka configuration of a raw producer of ``profile`` (``overrides`` on top)."""
    conf = profile_config(settings, profile)
    conf["client.id"] = client_id
    conf.update(overrides)
    return conf


def verified_producer(settings: Settings, profile: ProducerProfile, client_id: str) -> EventProducer:
    """An :class:`EventProducer` of ``profile`` whose broker has granted what the profile needs.

    Blocks until the broker answers (call it from a thread); raises ``BrokerCapabilityError``
    outside dev mode when an idempotent producer id is refused.
    """
    producer = EventProducer(settings, profile, client_id=client_id)
    producer.verify_profile()
    return producer


def admin_client(settings: Settings, **overrides: Any) -> AdminClient:
    """An admin client with the connection and security settings (``overrides`` on top)."""
    return AdminClient({**settings.kafka_client_config(), **overrides})
