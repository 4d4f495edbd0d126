"""The managed servers really work: produce/consume on the broker, restarts keep data.

The broker and the ClickHouse server are this module's own: it restarts and kills them."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from clickhouse_driver import Client
from clickhouse_driver.errors import NetworkError
from confluent_kafka import (
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from app.servers import KafkaKRaftBroker
from testing.clickhouse import ClickHouseServer
from tests.integration.stack import create_topic

pytestmark = pytest.mark.integration


N_MESSAGES = 100


def produce(bootstrap: str, topic: str, keys: list[str]) -> None:
    errors: list[object] = []

    def on_delivery(err: object, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i, key in enumerate(keys):
        producer.produce(topic, key=key, value=f"v{i}", on_delivery=on_delivery)
    assert producer.flush(30) == 0, "messages still in flight after 30s"
    assert errors == []


def consume(bootstrap: str, topic: str, group: str, expected: int, timeout: float = 60.0) -> list[Message]:
    """Read ``expected`` records of ``topic`` from the beginning, committing the offsets."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "enable.auto.commit": False,
        }
    )
    received: list[Message] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(received) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                received.append(msg)
        if received:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return received


def committed_total(bootstrap: str, topic: str, group: str, partitions: int) -> int:
    """Committed offsets summed; retried while the coordinator is still loading after a restart
    (the broker answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS for a few seconds)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        deadline = time.monotonic() + 60
        while True:
            try:
                return sum(max(tp.offset, 0) for tp in consumer.committed(tps, timeout=30))
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()


def test_produce_and_consume_keyed_messages(module_kafka: KafkaKRaftBroker, unique: str) -> None:
    broker = module_kafka
    topic, group = f"servers-{unique}", f"servers-{unique}"
    keys = [f"key-{i:03d}" for i in range(N_MESSAGES)]
    create_topic(broker.bootstrap, topic, partitions=3)
    produce(broker.bootstrap, topic, keys)

    received = consume(broker.bootstrap, topic, group, N_MESSAGES)

    assert len(received) == N_MESSAGES
    assert sorted(m.key().decode() for m in received) == keys
    partition_of: dict[bytes, set[int]] = {}
    for msg in received:
        partition_of.setdefault(msg.key(), set()).add(msg.partition())
    assert all(len(parts) == 1 for parts in partition_of.values())
    assert {m.partition() for m in received} == {0, 1, 2}


def test_kafka_restart_keeps_records_and_offsets(module_kafka: KafkaKRaftBroker, unique: str) -> None:
    kafka_broker = module_kafka
    topic, group = f"servers-{unique}", f"servers-{unique}"
    keys = [f"key-{i:03d}" for i in range(N_MESSAGES)]
    create_topic(kafka_broker.bootstrap, topic, partitions=3)
    produce(kafka_broker.bootstrap, topic, keys)
    assert len(consume(kafka_broker.bootstrap, topic, group, N_MESSAGES)) == N_MESSAGES
    pid = kafka_broker.pid

    kafka_broker.restart()

    assert kafka_broker.running and kafka_broker.pid != pid
    assert committed_total(kafka_broker.bootstrap, topic, group, 3) == N_MESSAGES
    again = consume(kafka_broker.bootstrap, topic, f"{group}-after", N_MESSAGES)
    assert sorted(m.key().decode() for m in again) == keys


def test_kafka_survives_sigkill(module_kafka: KafkaKRaftBroker, unique: str) -> None:
    kafka_broker = module_kafka
    topic = f"servers-{unique}"
    first = [f"a-{i:03d}" for i in range(50)]
    second = [f"b-{i:03d}" for i in range(50)]
    create_topic(kafka_broker.bootstrap, topic, partitions=3)
    produce(kafka_broker.bootstrap, topic, first)

    kafka_broker.kill()
    assert not kafka_broker.running
    kafka_broker.start()

    produce(kafka_broker.bootstrap, topic, second)
    received = consume(kafka_broker.bootstrap, topic, f"servers-{unique}", 100)
    assert sorted(m.key().decode() for m in received) == first + second


def test_clickhouse_data_survives_restart(clickhouse_server: ClickHouseServer, unique: str) -> None:
    table = f"servers_{unique}"
    client = Client(clickhouse_server.host, clickhouse_server.tcp_port)
    client.execute(
        f"CREATE TABLE {table} (id UInt32, kind LowCardinality(String), ts DateTime)"
        " ENGINE = MergeTree ORDER BY id"
    )
    epoch = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [(i, f"kind-{i % 3}", epoch + timedelta(seconds=i)) for i in range(1000)]
    client.execute(f"INSERT INTO {table} (id, kind, ts) VALUES", rows)
    assert client.execute(f"SELECT count() FROM {table}") == [(1000,)]
    client.disconnect()

    clickhouse_server.stop()
    with pytest.raises(NetworkError):
        Client(clickhouse_server.host, clickhouse_server.tcp_port).execute("SELECT 1")
    clickhouse_server.start()

    client = Client.from_url(clickhouse_server.url)
    assert client.execute(f"SELECT count(), uniqExact(kind) FROM {table}") == [(1000, 3)]
    client.disconnect()
