"""The retry forwarder's consumer: its configuration and what assignment changes do to the holds."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from app.ops.retry.forwarder import RetryForwarder
from app.platform.settings import Settings


def test_consumer_config_keeps_the_short_fetch_wait_and_the_offset_reset() -> None:
    forwarder = RetryForwarder(Settings(), group_id="unit", auto_offset_reset="latest")
    config = forwarder.consumer_loop.config
    assert config["group.id"] == "unit"
    assert config["client.id"] == "avcc-retry"
    assert config["fetch.wait.max.ms"] == 100
    assert config["auto.offset.reset"] == "latest"
    assert config["enable.auto.commit"] is False
    assert forwarder.consumer_loop.topics == ["topic.system.retry"]


def test_assignment_changes_clear_holds() -> None:
    forwarder = RetryForwarder(Settings(), group_id="unit")
    loop = forwarder.consumer_loop
    tp = ("topic.system.retry", 2)
    forwarder.holds.hold(tp, 7, until_ms=10**15)
    loop._assign(None, [TopicPartition(*tp)])
    assert forwarder.holds.paused == {} and forwarder.assignment() == [tp]
    forwarder.holds.hold(tp, 7, until_ms=10**15)
    loop._lose(None, [TopicPartition(*tp)])
    assert forwarder.holds.paused == {} and forwarder.assignment() == []
