"""The broker supervisor on a stand-in broker and a hand-driven clock: an exit is restarted after
the backoff's delay, on the same broker (its data), its return is logged, a start that fails or
never becomes ready counts as one more crash, and a crash loop quotes the broker's log."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.servers.process import ServerStartError
from app.supervisor.backoff import BackoffPolicy
from app.supervisor.broker import BrokerSupervisor


@dataclass
class _Process:
    returncode: int | None = None

    def log_tail(self, limit: int) -> str:
        return "ERROR Exiting Kafka due to fatal exception"


@dataclass
class _Broker:
    """What the supervisor uses of a ``KafkaKRaftBroker``."""

    bootstrap: str = "127.0.0.1:19092"
    data_dir: Path = Path("/var/avcc/kafka")
    ready_timeout: float = 90.0
    running: bool = True
    answers: bool = True
    refuse_start: bool = False
    process: _Process = field(default_factory=_Process)
    starts: int = 0
    pid: int = 4242

    def start(self, *, wait: bool = True) -> None:
        assert not wait, "the supervisor never blocks on a start"
        if self.refuse_start:
            raise ServerStartError("kafka: storage format failed")
        self.starts += 1
        self.running, self.process = True, _Process()

    def ready_now(self) -> bool:
        return self.running and self.answers

    def kill(self) -> None:
        self.crash(-9)

    def crash(self, status: int) -> None:
        self.running, self.process.returncode = False, status


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _supervise(broker: _Broker, clock: _Clock) -> BrokerSupervisor:
    policy = BackoffPolicy(initial_s=1.0, max_s=8.0, stable_s=60.0, crash_loop_after=3)
    stand_in: Any = broker
    return BrokerSupervisor(stand_in, policy=policy, clock=clock)


def test_a_broker_that_exits_is_restarted_on_its_data_after_the_backoff_and_its_return_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker, clock = _Broker(), _Clock()
    supervisor = _supervise(broker, clock)
    caplog.set_level(logging.INFO, logger="avcc.dev")
    clock.now += 40.0
    broker.crash(-9)
    supervisor.tick()
    clock.now += 0.5
    supervisor.tick()
    assert broker.starts == 0, "not before its delay"
    clock.now += 0.5
    broker.answers = False
    supervisor.tick()
    assert broker.starts == 1 and supervisor.restarts == 1
    clock.now += 3.0
    supervisor.tick()  # started, not answering yet
    broker.answers = True
    clock.now += 2.0
    supervisor.tick()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "embedded Kafka broker on 127.0.0.1:19092 exited (killed by SIGKILL) after 40.0s; restart #1 in "
        "1.0s on its data in /var/avcc/kafka",
        "restarted the embedded Kafka broker (pid 4242, restart #1)",
        "embedded Kafka broker back on 127.0.0.1:19092 after 5.0s (restart #1), on its data in "
        "/var/avcc/kafka",
    ]
    supervisor.tick()
    assert broker.starts == 1, "a serving broker is left alone"


def test_failed_and_hanging_starts_count_as_crashes_and_a_loop_quotes_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker, clock = _Broker(), _Clock()
    supervisor = _supervise(broker, clock)
    caplog.set_level(logging.INFO, logger="avcc.dev")
    broker.crash(1)
    supervisor.tick()  # exit 1: restart in 1 s
    broker.refuse_start = True
    clock.now += 1.0
    supervisor.tick()  # the start itself fails: restart in 2 s
    broker.refuse_start, broker.answers = False, False
    clock.now += 2.0
    supervisor.tick()  # started, never answers
    clock.now += broker.ready_timeout + 1
    supervisor.tick()  # killed: the third crash in a row
    assert supervisor.restarts == 3 and broker.starts == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split("; ")[1].split(" on ")[0] for w in warnings] == [
        "restart #1 in 1.0s",
        "restart #2 in 2.0s",
        "restart #3 in 4.0s",
    ]
    assert "exited (exit status 1)" in warnings[0] and "exited (did not start)" in warnings[1]
    assert "crash-looping: 3 exits in a row" in warnings[2]
    assert "Exiting Kafka due to fatal exception" in warnings[2]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "embedded Kafka broker could not be started again: kafka: storage format failed",
        "embedded Kafka broker not ready 91s after its restart; killing it",
    ]
