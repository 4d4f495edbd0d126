"""The DLQ service's consumer: configuration and the manual assignment of the DLQ and state topics
from the store's positions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING

from app.ops.dlq.service import DlqService
from app.ops.dlq.store import DlqStore
from app.platform.settings import Settings
from tests.unit.ops.dlq.dead_letters import FakeSender, dead_letter


class RecordingConsumer:
    def __init__(self) -> None:
        self.assignments: list[list[tuple[str, int, int]]] = []

    def assign(self, partitions: list[Any]) -> None:
        self.assignments.append([(tp.topic, tp.partition, tp.offset) for tp in partitions])


def test_consumer_reads_from_the_earliest_offset_as_the_ops_dlq_group() -> None:
    config = DlqService(Settings()).partitions.config
    assert config["group.id"] == "avcc-ops-dlq"
    assert config["client.id"] == "avcc-ops-dlq"
    assert config["auto.offset.reset"] == "earliest"
    assert config["enable.auto.commit"] is False


def test_every_partition_is_assigned_from_the_stores_next_offset() -> None:
    partitions = DlqService(Settings(), topic="dlq-unit", state_topic="state-unit").partitions
    consumer = RecordingConsumer()
    partitions.consumer = consumer
    wanted = {("dlq-unit", 2), ("dlq-unit", 0), ("dlq-unit", 1), ("state-unit", 0)}
    partitions.assign_from(wanted, {("dlq-unit", 1): 40, ("state-unit", 0): 7})
    assert consumer.assignments == [
        [
            ("dlq-unit", 0, OFFSET_BEGINNING),
            ("dlq-unit", 1, 40),
            ("dlq-unit", 2, OFFSET_BEGINNING),
            ("state-unit", 0, 7),
        ]
    ]
    assert partitions.assigned == wanted
    partitions.assign_from({("dlq-unit", 0)}, {})
    assert partitions.assigned == {("dlq-unit", 0)}


def test_ready_only_once_the_store_reached_the_end_offsets_seen_at_start(tmp_path: Path) -> None:
    service = DlqService(Settings(), topic="dlq-unit", state_topic="state-unit")
    assert service.readiness() == (False, "DLQ store opening")
    with DlqStore(tmp_path / "dlq", sender=FakeSender()) as store:
        service._store = store
        service._catch_up = {("dlq-unit", 0): 2, ("state-unit", 1): 1, ("state-unit", 0): 0}
        service._check_caught_up()
        assert service.readiness() == (False, "reading the dead letters and their operator state")
        dead_letter(store, 1)  # DLQ partition 0 read up to offset 2
        service._check_caught_up()
        assert not service.caught_up
        store.skip_state(1, 0)  # state partition 1 read up to offset 1
        service._check_caught_up()
        assert service.readiness() == (True, "")
