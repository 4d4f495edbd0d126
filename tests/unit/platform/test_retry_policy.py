"""Error policy: in-process backoff schedule, retry-topic rounds, classification of failures."""

from __future__ import annotations

import pytest

from app.platform.errors import (
    BusinessRuleViolation,
    DependencyTimeout,
    DependencyUnavailable,
    LockConflict,
    NonRetriableError,
    SchemaViolation,
    UndecodableMessage,
)
from app.platform.retry_policy import RetryPolicy, classify
from app.platform.settings import Settings


def test_default_schedule_is_seed_backoff_then_one_retry_topic_round() -> None:
    policy = RetryPolicy()
    assert [policy.delay_before(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert policy.delay_before(4) is None  # seed 9.3.3: at most 3 in-process retries
    assert policy.after_in_process(DependencyTimeout("t"), 0) == "retry_topic"
    assert policy.after_in_process(DependencyTimeout("t"), 1) == "dead_letter"


def test_schedule_and_rounds_come_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AVCC_RETRY_BACKOFF_S", "[0.2, 0.4, 0.8, 1.6]")
    monkeypatch.setenv("AVCC_RETRY_TOPIC_ROUNDS", "2")
    monkeypatch.setenv("AVCC_RETRY_TOPIC_DELAY_S", "3.5")
    policy = RetryPolicy.from_settings(Settings())
    assert policy.backoff_s == (0.2, 0.4, 0.8, 1.6)
    assert [policy.delay_before(n) for n in range(1, 6)] == [0.2, 0.4, 0.8, 1.6, None]
    assert policy.topic_delay_s == 3.5
    assert policy.after_in_process(LockConflict("l"), 0) == "retry_topic"
    assert policy.after_in_process(LockConflict("l"), 1) == "retry_topic"
    assert policy.after_in_process(LockConflict("l"), 2) == "dead_letter"


def test_no_in_process_retries_goes_straight_to_the_retry_topic() -> None:
    policy = RetryPolicy(backoff_s=(), topic_rounds=1)
    assert policy.delay_before(1) is None
    assert policy.after_in_process(DependencyUnavailable("down"), 0) == "retry_topic"


def test_decide_is_the_one_decision_backoff_then_retry_topic_then_dead_letter() -> None:
    policy = RetryPolicy(backoff_s=(1.0, 2.0), topic_rounds=1)
    timeout = DependencyTimeout("t")
    assert [policy.decide(timeout, n, 0) for n in (1, 2, 3)] == [
        "retry_in_process",
        "retry_in_process",
        "retry_topic",
    ]
    assert policy.decide(timeout, 3, 1) == "dead_letter"
    assert policy.decide(SchemaViolation("bad", ["f"]), 1, 0) == "dead_letter"
    assert policy.decide(BusinessRuleViolation("no"), 1, 0) == "dead_letter"


def test_zero_topic_rounds_dead_letters_after_backoff() -> None:
    assert RetryPolicy(topic_rounds=0).after_in_process(DependencyTimeout("t"), 0) == "dead_letter"


@pytest.mark.parametrize(
    "exc",
    [
        UndecodableMessage("bytes"),
        SchemaViolation("payload.priority: bad", ["payload.priority"]),
        BusinessRuleViolation("final state"),
        NonRetriableError("no"),
    ],
)
def test_contract_and_business_failures_are_not_retried(exc: Exception) -> None:
    assert classify(exc) == "non_retriable"
    # even with rounds left, a non-retriable failure is dead-lettered
    assert RetryPolicy(topic_rounds=5).after_in_process(exc, 0) == "dead_letter"


@pytest.mark.parametrize(
    "exc",
    [
        DependencyTimeout("t"),
        DependencyUnavailable("u"),
        LockConflict("l"),
        TimeoutError(),
        ConnectionError(),
        KeyError("bug"),  # unexpected bugs are retried, then reach the DLQ with their stack trace
        ZeroDivisionError(),
    ],
)
def test_transient_failures_and_bugs_are_retried(exc: Exception) -> None:
    assert classify(exc) == "retriable"
