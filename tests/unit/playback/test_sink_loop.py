"""The sink loop over a scripted consumer and a flaky backend (no broker, no ClickHouse)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from app.platform.errors import DependencyUnavailable
from app.platform.settings import Settings
from app.playback.sink.batch import SinkTopics
from app.playback.sink.loop import SinkLoop
from app.playback.sink.settings import SinkSettings
from tests.unit.playback.playback_documents import T0, event

# --- the sink loop over the store (scripted consumer, no broker) -----------------------------------


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        self._topic, self._partition, self._offset, self._value = topic, partition, offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes:
        return b"k"

    def timestamp(self) -> tuple[int, int]:
        return (1, T0)

    def headers(self) -> None:
        return None


class FakeConsumer:
    """Serves scripted batches; records pause/resume/commit calls in ``log`` (shared with the backend)."""

    def __init__(self, batches: list[list[FakeMessage]], log: list[str]) -> None:
        self.batches = batches
        self.log = log
        self.paused = False
        self.on_revoke: Any = None

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        if self.paused or not self.batches:
            return []
        return self.batches.pop(0)

    def assignment(self) -> list[Any]:
        return ["tp"]

    def pause(self, partitions: Any) -> None:
        self.paused = True
        self.log.append("pause")

    def resume(self, partitions: Any) -> None:
        self.paused = False
        self.log.append("resume")

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        assert asynchronous is False
        self.log.append("commit " + ",".join(f"{tp.topic}/{tp.partition}@{tp.offset}" for tp in offsets))


class FlakyBackend:
    """Records inserts; the first ``failures`` inserts raise DependencyUnavailable."""

    description = "fake"
    supports_dedup_token = False

    def __init__(self, log: list[str], failures: int = 0) -> None:
        self.log = log
        self.failures = failures
        self.rows: list[tuple[Any, ...]] = []

    def insert_columns(self, table: str, names: Any, columns: Any, dedup_token: str | None = None) -> None:
        if self.failures:
            self.failures -= 1
            self.log.append(f"insert-failed {table}")
            raise DependencyUnavailable("ClickHouse is down")
        self.log.append(f"insert {table} {len(columns[0])}")
        self.rows.extend(zip(*columns, strict=True))


def _sink_loop(consumer: FakeConsumer, backend: FlakyBackend, letters: list[Any]) -> SinkLoop:
    loop = SinkLoop(
        settings=Settings(),
        backend=backend,  # type: ignore[arg-type]
        dead_letter=letters.extend,
        config=SinkSettings(
            batch_max_rows=4, batch_max_seconds=60, backoff_initial_s=0.01, backoff_max_s=0.02
        ),
        topics=SinkTopics("pb", "an", "dlq"),
        group_id="g",
    )
    loop.consumer = consumer
    return loop


def _valid(i: int) -> bytes:
    document = event()
    document["event_id"] = str(uuid.UUID(int=i, version=4))
    return orjson.dumps(document)


def test_sink_loop_commits_only_after_the_insert_and_pauses_through_an_outage() -> None:
    import threading

    log: list[str] = []
    letters: list[Any] = []
    batches = [
        [FakeMessage("pb", 0, 10, _valid(1)), FakeMessage("pb", 1, 5, b"garbage")],
        [FakeMessage("pb", 0, 11, _valid(2)), FakeMessage("pb", 0, 12, _valid(1))],
        [FakeMessage("pb", 1, 6, _valid(3))],
    ]
    consumer = FakeConsumer(batches, log)
    backend = FlakyBackend(log, failures=2)
    loop = _sink_loop(consumer, backend, letters)
    stop = threading.Event()
    loop._consume(0)
    loop._consume(0)  # 4 messages: the batch is full
    batch = loop._batch
    loop._flush_until_done(batch, stop)
    assert log == [
        "insert-failed playback_events",
        "pause",
        "insert-failed playback_events",
        "insert playback_events 2",  # event 1 redelivered inside the batch counts once
        "commit pb/0@13,pb/1@6",
        "resume",
    ]
    assert [letter.value for letter in letters] == [b"garbage"]  # sent once, not per retry
    assert letters[0].topic == "dlq"
    assert loop.stats.duplicates_in_batch == 1 and loop.stats.insert_failures == 2
    assert loop._batch is not batch and not loop.stats.paused


def test_sink_loop_drops_the_uncommitted_batch_on_revoke() -> None:
    log: list[str] = []
    consumer = FakeConsumer([[FakeMessage("pb", 0, 1, _valid(1))]], log)
    loop = _sink_loop(consumer, FlakyBackend(log), [])
    loop._consume(0)
    assert loop._batch.messages == 1
    loop.on_revoked([], lost=False)
    assert loop._batch.messages == 0 and loop.stats.dropped_on_revoke == 1
    assert log == []  # nothing inserted, nothing committed: the new owner gets the message again
