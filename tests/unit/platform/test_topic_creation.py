"""Creating the topic plan survives a create request lost on its way (seen on a fresh 3-node
cluster: ``_DESTROY_BROKER`` as the client replaced its bootstrap connection)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from app.platform.kafka import admin as plan_admin
from app.platform.settings import Settings
from app.platform.topics import TOPIC_PLAN


class FakeAdmin:
    """Answers each ``create_topics`` call from a script: topic name -> error code or None."""

    def __init__(self, *answers: dict[str, int | None]) -> None:
        self.answers = list(answers)
        self.requests: list[list[str]] = []

    def create_topics(self, topics: list[Any], operation_timeout: float) -> dict[str, Future[None]]:
        answer = self.answers.pop(0)
        self.requests.append([t.topic for t in topics])
        futures: dict[str, Future[None]] = {}
        for topic in topics:
            future: Future[None] = Future()
            code = answer.get(topic.topic)
            if code is None:
                future.set_result(None)
            else:
                future.set_exception(KafkaException(KafkaError(code)))
            futures[topic.topic] = future
        return futures


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_admin, "_CREATE_RETRY_S", 0.0)


SPECS = list(TOPIC_PLAN[:3])
A, B, C = (s.name for s in SPECS)


def test_a_create_lost_on_its_way_is_sent_again() -> None:
    admin = FakeAdmin({A: None, B: KafkaError._DESTROY_BROKER, C: KafkaError.NOT_CONTROLLER}, {})
    created, raced = plan_admin._create_topics(admin, Settings(), SPECS)  # type: ignore[arg-type]
    assert admin.requests == [[A, B, C], [B, C]]
    assert sorted(created) == sorted([A, B, C]) and raced == []


def test_a_resent_create_that_had_gone_through_counts_as_existing() -> None:
    admin = FakeAdmin({A: KafkaError._TIMED_OUT}, {A: KafkaError.TOPIC_ALREADY_EXISTS})
    created, raced = plan_admin._create_topics(admin, Settings(), SPECS[:1])  # type: ignore[arg-type]
    assert (created, raced) == ([], [A])


def test_a_refused_create_is_not_sent_again() -> None:
    admin = FakeAdmin({A: KafkaError.POLICY_VIOLATION})
    with pytest.raises(KafkaException):
        plan_admin._create_topics(admin, Settings(), SPECS[:1])  # type: ignore[arg-type]
    assert admin.requests == [[A]]


def test_a_create_failing_on_its_way_every_time_gives_up() -> None:
    admin = FakeAdmin(*({A: KafkaError._TRANSPORT} for _ in range(plan_admin._CREATE_ATTEMPTS)))
    with pytest.raises(KafkaException):
        plan_admin._create_topics(admin, Settings(), SPECS[:1])  # type: ignore[arg-type]
    assert len(admin.requests) == plan_admin._CREATE_ATTEMPTS


def scripted_describe(monkeypatch: pytest.MonkeyPatch, *answers: dict[str, Any] | int) -> list[list[str]]:
    """``describe_topics`` answering from a script: a dict of found topics, or an error code
    raised as the describe-configs answer of a broker that does not know a listed topic."""
    script = list(answers)
    calls: list[list[str]] = []

    def describe(settings: Settings, names: list[str]) -> dict[str, Any]:
        calls.append(list(names))
        answer = script.pop(0)
        if isinstance(answer, int):
            raise KafkaException(KafkaError(answer))
        return answer

    monkeypatch.setattr(plan_admin, "describe_topics", describe)
    monkeypatch.setattr(plan_admin.time, "sleep", lambda s: None)
    return calls


def test_a_topic_listed_by_one_broker_and_unknown_to_another_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = {A: {"partitions": 6}}
    calls = scripted_describe(monkeypatch, KafkaError.UNKNOWN_TOPIC_OR_PART, {}, found)
    assert plan_admin._describe_when_visible(Settings(), [A]) == found
    assert calls == [[A], [A], [A]]


def test_other_describe_errors_are_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = scripted_describe(monkeypatch, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        plan_admin._describe_when_visible(Settings(), [A])
    assert calls == [[A]]


def test_a_topic_unknown_past_the_deadline_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = scripted_describe(monkeypatch, KafkaError.UNKNOWN_TOPIC_OR_PART)
    with pytest.raises(KafkaException):
        plan_admin._describe_when_visible(Settings(), [A], wait_s=-1.0)
    assert calls == [[A]]
