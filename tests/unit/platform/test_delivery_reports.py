"""The playback profile's deliveries are reported only when they fail: no report crosses into
Python per firehose event, yet every undelivered message is counted and logged. The failures
here are librdkafka's own: messages purged from its queue are reported as failed deliveries."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from app.platform.errors import BrokerCapabilityError
from app.platform.kafka.producers import EventProducer, profile_config
from app.platform.metrics import PRODUCER_DELIVERY_FAILURES
from app.platform.settings import Settings

#: A loopback port nothing listens on: messages stay queued in the client.
NOWHERE = Settings(kafka_url="kafka://127.0.0.1:9")


def failures(topic: str) -> float:
    return PRODUCER_DELIVERY_FAILURES.labels("playback", topic)._value.get()


def test_only_the_playback_profile_reports_failures_only() -> None:
    assert profile_config(NOWHERE, "playback")["delivery.report.only.error"] is True
    assert "delivery.report.only.error" not in profile_config(NOWHERE, "core")


def test_a_playback_producer_refuses_to_wait_for_an_acknowledgement() -> None:
    producer = EventProducer(NOWHERE, "playback")
    try:
        assert producer.acknowledges is False
        with pytest.raises(TypeError, match="send_nowait"):
            asyncio.run(producer.send("t", b"v"))
    finally:
        producer.close(timeout_s=0.1)


def test_every_undelivered_playback_message_is_counted_and_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = "delivery-failures-unit"
    before = failures(topic)
    producer = EventProducer(NOWHERE, "playback")
    caplog.set_level(logging.ERROR, logger="app.platform.kafka.producers")
    try:
        for n in range(5):
            producer.send_nowait(topic, b"v%d" % n, b"k")
        producer._producer.purge(in_queue=True, in_flight=True)
        deadline = time.monotonic() + 10
        while failures(topic) - before < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        producer.close(timeout_s=0.1)
    assert failures(topic) - before == 5
    lines = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert len(lines) == 1 and topic in lines[0], lines


def test_a_core_producer_still_acknowledges_every_send() -> None:
    producer = EventProducer(NOWHERE, "core")
    try:
        assert producer.acknowledges is True
    finally:
        producer.close(timeout_s=0.1)


def test_a_broker_that_never_answers_is_asked_again_until_the_deadline_then_named() -> None:
    """A metadata request that times out is not the end (a TLS + SASL login on a busy box can
    take longer than one request's 2 s); only the deadline is, with what went wrong."""
    producer = EventProducer(NOWHERE, "core")
    try:
        started = time.monotonic()
        state = producer.idempotence_state(timeout_s=4.5)
        assert time.monotonic() - started >= 4.5, "gave up before the deadline"
        assert state.startswith("no answer: "), state
        with pytest.raises(BrokerCapabilityError, match="no answer: "):
            producer.verify_profile(timeout_s=2.5)
    finally:
        producer.close(timeout_s=0.1)
