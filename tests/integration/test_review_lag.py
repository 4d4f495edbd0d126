"""Seed 9.3.4 on the running pipeline: with the review group stopped and more than 1000
applications queued, the lag alert fires (with a scale-out recommendation) and resolves once
the restarted group has caught up.

The review worker and its broker are this module's own: it stops the worker and queues 1,100
events for it."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from app.ops.lag.lifecycle import AlertEvent
from app.ops.lag.monitor import LagMonitor, LagReport
from app.ops.lag.settings import LagSettings
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.kafka.partitioner import record_key
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, TOPIC_PLAN
from app.servers import KafkaKRaftBroker
from schemas.apply import AiToolInfo, ApplyCreated
from schemas.envelope import encode_event, make_envelope
from tests.integration.stack import Stack

QUEUED = 1100


def queue_applications(bootstrap: str, count: int) -> None:
    """Produce ``count`` valid apply.created events (what code-svc emits after pre-check)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    base = 5_000_000 + int(time.time()) % 1_000_000 * 100
    for n in range(count):
        record_id = base + n
        payload = ApplyCreated(
            request_id=f"req_lag_{record_id}",
            avcc_record_id=record_id,
            content_url="s3://aigc-hub-storage/works/raw/lag.mp4",
            content_hash="sha256:" + hashlib.sha256(uuid.uuid4().bytes).hexdigest(),
            ai_tool_info=AiToolInfo(model_name="Stable-Diffusion-XL", model_version="v1.0"),
            priority=5,
        )
        env = make_envelope(payload, source="code-svc")
        producer.produce(APPLY_CREATED.name, encode_event(env), record_key(record_id))
        if n % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


@pytest.fixture(scope="module")
def review_stack(module_kafka: KafkaKRaftBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A review worker of this module alone (the lag rule is about its group and apply.created)."""
    root = tmp_path_factory.mktemp("review-lag")
    apply_plan(Settings(kafka_url=f"kafka://{module_kafka.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    stack = Stack(module_kafka.bootstrap, root)
    try:
        stack.start("review")
        yield stack
    finally:
        stack.stop_all()


def review_rule_events(report: LagReport) -> list[AlertEvent]:
    return [e for e in report.events if e.topic == APPLY_CREATED.name and e.group == "avcc-review"]


async def test_review_lag_alert_fires_then_resolves(review_stack: Stack) -> None:
    core_stack = review_stack
    settings = Settings(kafka_url=f"kafka://{core_stack.bootstrap}")
    config = LagSettings(interval_s=1.0, window_s=60.0)
    monitor = LagMonitor(settings, config, sinks=[])
    core_stack.stop("review")
    try:
        queue_applications(core_stack.bootstrap, QUEUED)
        queued_at = time.monotonic()
        fired: list[AlertEvent] = []
        while not fired:
            assert time.monotonic() - queued_at < 60, "the lag alert did not fire within the rule's window"
            report = await monitor.tick()
            fired = [e for e in review_rule_events(report) if e.kind == "firing"]
            await asyncio.sleep(config.interval_s)
        assert fired[0].lag > 1000
        assert fired[0].rule.scale_group == "review" and "scale out" in fired[0].rule.action
    finally:
        core_stack.start("review")

    resolved: list[AlertEvent] = []
    started = time.monotonic()
    while not resolved:
        assert time.monotonic() - started < 240, "the lag alert did not resolve after the group caught up"
        report = await monitor.tick()
        resolved = [e for e in review_rule_events(report) if e.kind == "resolved"]
        await asyncio.sleep(config.interval_s)
    state = next(r for r in report.rules if r.topic == APPLY_CREATED.name and r.group == "avcc-review")
    assert not state.firing
    await monitor.close()


pytestmark = pytest.mark.timeout(420)
