"""Topic plan application, producer profiles and partitioning against real brokers."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from app.cli import main
from app.platform.kafka.admin import apply_plan, describe_topics
from app.platform.kafka.partitioner import partition_for, record_key
from app.platform.kafka.producers import EventProducer
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, COMPACTION, HOUR_MS, INFINITE, TOPIC_PLAN, TopicSpec


def uniquely_named(unique: str) -> list[TopicSpec]:
    """The plan's topics under unique names (tests never share topics)."""
    return [dataclasses.replace(s, name=f"{s.name}.{unique}") for s in TOPIC_PLAN]


def test_apply_creates_the_plan_then_reports_no_drift(broker, unique: str) -> None:
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}")
    plan = uniquely_named(unique)
    first = apply_plan(settings, plan)
    assert sorted(first.created) == sorted(s.name for s in plan)
    actual = describe_topics(settings, [s.name for s in plan])
    for spec in plan:
        assert actual[spec.name]["partitions"] == spec.partitions, spec.name
        assert actual[spec.name]["config"]["retention.ms"] == str(spec.retention_ms), spec.name
    second = apply_plan(settings, plan)
    assert second.created == [] and second.drift == []


def test_retention_drift_is_fixed_and_partition_drift_needs_the_flag(broker, unique: str) -> None:
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}")
    spec = TopicSpec(f"drift.{unique}", 2, 3_600_000, "delete", "k", "core", "test")
    apply_plan(settings, [spec])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    override = ConfigEntry("segment.ms", "600000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, spec.name, incremental_configs=[override])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)  # an operator's tuning
    grown = dataclasses.replace(spec, partitions=4, retention_ms=7_200_000)
    report = apply_plan(settings, [grown])
    assert {d.setting for d in report.unfixed} == {"partitions"}
    assert [d.setting for d in report.drift if d.fixed] == ["retention.ms"]
    # described at once as fixed (apply_plan waits for the broker to say so), the override kept
    conf = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, spec.name)])
    values = next(iter(conf.values())).result()
    assert (values["retention.ms"].value, values["segment.ms"].value) == ("7200000", "600000")
    report = apply_plan(settings, [grown], grow_partitions=True)
    assert report.unfixed == []
    assert describe_topics(settings, [spec.name])[spec.name]["partitions"] == 4
    shrunk = dataclasses.replace(grown, partitions=3)
    assert apply_plan(settings, [shrunk]).unfixed[0].setting == "partitions"


def test_a_changelog_is_compacted_to_keep_replays_short_and_its_compaction_drift_is_fixed(
    broker, unique: str
) -> None:
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}")
    spec = TopicSpec(f"changelog.{unique}", 2, INFINITE, "compact", "table key", "core", "test")
    apply_plan(settings, [spec])
    config = describe_topics(settings, [spec.name])[spec.name]["config"]
    assert {k: config[k] for k in COMPACTION} == dict(COMPACTION)
    assert COMPACTION["segment.ms"] == str(HOUR_MS)  # the active segment rolls, so it is compacted
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    reset = ConfigEntry("min.cleanable.dirty.ratio", "0.5", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, spec.name, incremental_configs=[reset])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    report = apply_plan(settings, [spec])
    assert [(d.setting, d.fixed) for d in report.drift] == [("min.cleanable.dirty.ratio", True)]
    assert describe_topics(settings, [spec.name])[spec.name]["config"]["min.cleanable.dirty.ratio"] == "0.1"


def test_topics_apply_cli_exit_codes(broker, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.platform.settings import get_settings

    monkeypatch.setenv("AVCC_KAFKA_URL", f"kafka://{broker.bootstrap}")
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        first = runner.invoke(main, ["topics", "apply"])
        assert first.exit_code == 0, first.output
        again = runner.invoke(main, ["topics", "apply"])
        assert again.exit_code == 0 and "no drift" in again.output
    finally:
        get_settings.cache_clear()


def test_core_profile_gets_an_idempotent_producer_id(broker) -> None:
    producer = EventProducer(Settings(kafka_url=f"kafka://{broker.bootstrap}"), "core")
    try:
        assert producer.config["acks"] == "all"
        assert producer.config["enable.idempotence"] is True
        assert producer.config["retries"] == 2_147_483_647
        assert producer.idempotence_state(timeout_s=20) == "Assigned"
        producer.verify_profile()
        assert producer.stats["eos"]["producer_id"] >= 0
    finally:
        producer.close()


def test_playback_profile_is_acks_1_linger_5_64k(broker) -> None:
    producer = EventProducer(Settings(kafka_url=f"kafka://{broker.bootstrap}"), "playback")
    try:
        assert (producer.config["acks"], producer.config["linger.ms"], producer.config["batch.size"]) == (
            1,
            5,
            65536,
        )
        assert producer.config["enable.idempotence"] is False
    finally:
        producer.close()


def test_produced_keys_land_on_the_java_murmur2_partition(broker, unique: str) -> None:
    settings = Settings(kafka_url=f"kafka://{broker.bootstrap}")
    spec = dataclasses.replace(APPLY_CREATED, name=f"keys.{unique}")
    apply_plan(settings, [spec])
    producer = EventProducer(settings, "core")

    async def produce_all() -> list[tuple[int, int]]:
        deliveries = await producer.send_many(
            [(spec, b"v", record_key(i), None) for i in range(10_000, 10_200)]
        )
        return [(10_000 + n, d.partition) for n, d in enumerate(deliveries)]

    try:
        placed = asyncio.run(produce_all())
    finally:
        producer.close()
    for record_id, partition in placed:
        assert partition == partition_for(record_key(record_id), spec.partitions), record_id


def test_playback_messages_the_broker_refuses_are_counted_and_the_rest_stored(broker, unique: str) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import NewTopic

    from app.platform.metrics import PRODUCER_DELIVERY_FAILURES

    topic = f"playback-refusals.{unique}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    created = admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2048"})])
    created[topic].result(timeout=30)
    counter = PRODUCER_DELIVERY_FAILURES.labels("playback", topic)
    before = counter._value.get()
    producer = EventProducer(Settings(kafka_url=f"kafka://{broker.bootstrap}"), "playback")
    try:
        # One flush each: the broker refuses a whole record batch, so the big one travels alone.
        for value in (b"small-0", b"small-1", b"x" * 8192, b"small-2"):  # 8 KiB: too big for the topic
            producer.send_nowait(topic, value, b"k")
            assert producer.flush(30) == 0
    finally:
        producer.close()
    assert counter._value.get() - before == 1
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"refusals-{unique}",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        stored: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(stored) < 3 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                stored.append(message.value())
    finally:
        consumer.close()
    assert sorted(stored) == [b"small-0", b"small-1", b"small-2"]
