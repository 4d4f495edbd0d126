"""The offset reader stops a read under way when it is aborted or closed: with the broker gone
every request waits its whole timeout, and a read asks about every partition in turn."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from app.platform.lag import reader as reader_module
from app.platform.lag.reader import OffsetReader, ReaderAborted
from app.platform.settings import Settings
from tests.unit.ops.lag.lag_samples import config

PARTITIONS = [("t-gone", p) for p in range(200)]


class _Broker:
    """What the reader's consumers talk to: while ``gone``, each watermark request blocks until
    the test lets one answer (a request waiting out its timeout)."""

    def __init__(self) -> None:
        self.gone = True
        self.watermark_requests = 0
        self.asked = threading.Event()
        self.answer = threading.Semaphore(0)

    def consumer(self, conf: dict[str, Any]) -> _Consumer:
        return _Consumer(self)


class _Consumer:
    def __init__(self, broker: _Broker) -> None:
        self.broker = broker

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 5) for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        broker = self.broker
        broker.watermark_requests += 1
        if broker.gone:
            broker.asked.set()
            broker.answer.acquire()
        return 0, 10

    def close(self) -> None:
        pass


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> _Broker:
    broker = _Broker()
    monkeypatch.setattr(reader_module, "Consumer", broker.consumer)
    return broker


def _wait(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return True
        pause.wait(0.01)
    return condition()


def test_an_aborted_read_stops_at_its_next_request_and_a_closed_reader_reads_again(broker: _Broker) -> None:
    reader = OffsetReader(Settings(), request_timeout_s=0.01, watched=config().watched())
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(reader.group_offsets("g-gone", PARTITIONS))
        except ReaderAborted as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        assert _wait(broker.asked.is_set), "the read never reached the watermarks"
        reader.abort()
        broker.answer.release()  # the request under way answers
        thread.join(10)
        assert not thread.is_alive(), "the aborted read went on"
    finally:
        broker.gone = False
        for _ in PARTITIONS:
            broker.answer.release()
        thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], ReaderAborted), outcome
    assert broker.watermark_requests == 1, "no request after the one under way when aborted"

    reader.close()
    offsets = reader.group_offsets("g-gone", [("t-gone", 0), ("t-gone", 1)])
    assert [(o.partition, o.end, o.committed) for o in offsets] == [(0, 10, 5), (1, 10, 5)]
