"""The start-up access check's verdicts on what librdkafka reports (the broker side runs in
tests/integration/test_kafka_security.py)."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException

from app.platform.groups import group_spec
from app.platform.kafka.access import EXIT_NOT_AUTHORIZED, _Reasons, refused_by_acl
from app.platform.settings import Settings


def _log(text: str) -> logging.LogRecord:
    return logging.LogRecord("librdkafka", logging.INFO, __file__, 1, text, None, None)


REFUSED = "FAIL [thrd:127.0.0.1:9093/bootstrap]: Connect to 127.0.0.1:9093 failed: Connection refused"
CLOSED = "FAIL [thrd:127.0.0.1:9093/bootstrap]: Disconnected (after 1ms in state APIVERSION_QUERY)"


def test_a_broker_that_is_not_up_yet_is_waited_for() -> None:
    reasons = _Reasons()
    for _ in range(10):
        reasons.on_log(_log(REFUSED))
    assert reasons.protocol_mismatch() is None
    assert reasons.fatal == []


def test_connections_closed_before_the_first_answer_mean_another_protocol() -> None:
    reasons = _Reasons()
    reasons.on_log(_log(CLOSED))
    reasons.on_log(_log(CLOSED))
    assert reasons.protocol_mismatch() is None, "two closes may be a broker going down"
    reasons.on_log(_log(CLOSED))
    mismatch = reasons.protocol_mismatch()
    assert mismatch is not None and "before answering the first request" in mismatch


def test_librdkafka_s_own_protocol_hint_is_taken_at_once() -> None:
    reasons = _Reasons()
    hint = "FAIL: Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol"
    reasons.on_log(_log(hint))
    assert reasons.protocol_mismatch() == hint


def test_authentication_and_tls_errors_are_fatal_transport_ones_are_not() -> None:
    reasons = _Reasons()
    reasons.on_error(KafkaError(KafkaError._TRANSPORT, "down"))
    reasons.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert reasons.fatal == []
    reasons.on_error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error"))
    reasons.on_error(KafkaError(KafkaError._SSL, "certificate verify failed"))
    assert reasons.fatal == ["SASL authentication error", "certificate verify failed"]


def test_an_acl_refusal_at_start_becomes_a_clear_exit() -> None:
    settings = Settings(kafka_sasl_username="avcc-gateway")
    refused = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed"))
    refusal = refused_by_acl(refused, settings, group_spec("code"))
    assert refusal is not None and refusal.exit_code == EXIT_NOT_AUTHORIZED
    assert "User:avcc-gateway" in str(refusal) and "'avcc-code-'" in str(refusal)
    other = KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))
    assert refused_by_acl(other, settings, group_spec("code")) is None
    assert refused_by_acl(ValueError("x"), settings, group_spec("code")) is None


def test_a_broker_that_never_answers_ends_the_wait_with_its_own_status() -> None:
    from app.platform.kafka.access import EXIT_KAFKA_UNAVAILABLE, KafkaAccessRefused, _connected_admin
    from testing.ports import free_port

    settings = Settings(kafka_url=f"kafka://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        _connected_admin(settings, wait_s=1.0)
    except KafkaAccessRefused as refused:
        assert refused.exit_code == EXIT_KAFKA_UNAVAILABLE
        assert "did not answer within 1 s" in str(refused)
    else:
        raise AssertionError("a broker nobody runs was taken for an answer")
