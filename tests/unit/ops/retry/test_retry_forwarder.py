"""The retry forwarder's per-partition logic (fake consumer and producer, no broker)."""

from __future__ import annotations

from typing import Any

import pytest

from app.ops.retry import forwarder as forwarder_module
from app.ops.retry.forwarder import RetryForwarder
from app.ops.retry.schedule import due_at
from app.platform.faust.runtime import now_ms
from app.platform.kafka.producers import Delivery
from app.platform.settings import Settings


class FakeMessage:
    def __init__(self, offset: int, headers: list[tuple[str, bytes]], partition: int = 0) -> None:
        self._offset, self._headers, self._partition = offset, headers, partition

    def topic(self) -> str:
        return "topic.system.retry"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def error(self) -> None:
        return None


class FakeConsumer:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def pause(self, tps: list[Any]) -> None:
        self.calls.append(("pause", [(t.topic, t.partition) for t in tps]))

    def resume(self, tps: list[Any]) -> None:
        self.calls.append(("resume", [(t.topic, t.partition) for t in tps]))

    def seek(self, tp: Any) -> None:
        self.calls.append(("seek", (tp.partition, tp.offset)))

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.calls.append(("commit", [(t.partition, t.offset) for t in offsets]))


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, list[tuple[str, bytes]], int | None]] = []
        self.fail = False

    async def send(
        self, topic: Any, value: bytes, key: Any = None, headers: Any = None, partition: Any = None
    ) -> Delivery:
        if self.fail:
            raise RuntimeError("broker down")
        name = topic if isinstance(topic, str) else topic.name
        self.sent.append((name, value, list(headers or []), partition))
        return Delivery(name, partition or 0, 0)


def retry_headers(not_before: int | None, target: bytes = b"review") -> list[tuple[str, bytes]]:
    headers = [
        ("trace-id", b"t"),
        ("avcc-original-topic", b"topic.avcc.apply.created"),
        ("avcc-original-partition", b"4"),
        ("avcc-target-group", target),
    ]
    if not_before is not None:
        headers.append(("avcc-not-before-ms", str(not_before).encode()))
    return headers


class Clock:
    """The forwarder's ``now_ms``, moved by the test: due times without wall-clock margins."""

    def __init__(self) -> None:
        self.ms = now_ms()

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(forwarder_module, "now_ms", fake)
    return fake


@pytest.fixture
async def forwarder() -> Any:
    fwd = RetryForwarder(Settings(), group_id="unit")
    fwd._producer = FakeProducer()  # type: ignore[assignment]
    yield fwd
    fwd.consumer_loop.shutdown_thread()


def test_due_at_parses_the_not_before_header() -> None:
    assert due_at([("avcc-not-before-ms", b"1780000000000")]) == 1780000000000
    assert due_at([]) == 0
    assert due_at([("avcc-not-before-ms", b"soon")]) == 0


async def test_due_message_is_reproduced_unchanged_then_committed(forwarder: Any) -> None:
    consumer = FakeConsumer()
    headers = retry_headers(now_ms() - 1)
    await forwarder.handle(consumer, FakeMessage(5, headers))
    assert forwarder._producer.sent == [("topic.avcc.apply.created", b"v5", headers, 4)]
    assert consumer.calls == [("commit", [(0, 6)])]


async def test_message_not_due_pauses_and_rewinds_only_its_partition(forwarder: Any, clock: Clock) -> None:
    consumer = FakeConsumer()
    due = clock.ms + 200
    await forwarder.handle(consumer, FakeMessage(5, retry_headers(due)))
    assert consumer.calls == [("pause", [("topic.system.retry", 0)]), ("seek", (0, 5))]
    # a message of the same partition that was prefetched is ignored (it will be read again)
    await forwarder.handle(consumer, FakeMessage(6, retry_headers(None)))
    # another partition keeps flowing
    await forwarder.handle(consumer, FakeMessage(9, retry_headers(None), partition=1))
    assert [s[1] for s in forwarder._producer.sent] == [b"v9"]
    assert forwarder._poll_timeout() == pytest.approx(0.2)
    clock.ms += 199
    await forwarder._resume_due(consumer)
    assert consumer.calls[-1] == ("commit", [(1, 10)])  # not resumed yet
    clock.ms += 1
    await forwarder._resume_due(consumer)
    assert consumer.calls[-1] == ("resume", [("topic.system.retry", 0)])
    await forwarder.handle(consumer, FakeMessage(5, retry_headers(due)))
    await forwarder.handle(consumer, FakeMessage(6, retry_headers(None)))
    assert [s[1] for s in forwarder._producer.sent] == [b"v9", b"v5", b"v6"]


async def test_a_lost_rewind_never_skips_the_held_message(forwarder: Any, clock: Clock) -> None:
    consumer = FakeConsumer()
    await forwarder.handle(consumer, FakeMessage(5, retry_headers(clock.ms + 50)))
    clock.ms += 60
    await forwarder._resume_due(consumer)
    await forwarder.handle(consumer, FakeMessage(6, retry_headers(None)))  # 5 did not come back
    assert forwarder._producer.sent == []
    assert consumer.calls[-1] == ("seek", (0, 5))


async def test_failed_produce_holds_the_message_for_a_later_try(forwarder: Any) -> None:
    consumer = FakeConsumer()
    forwarder._producer.fail = True
    await forwarder.handle(consumer, FakeMessage(5, retry_headers(None)))
    assert ("seek", (0, 5)) in consumer.calls
    assert not any(c[0] == "commit" for c in consumer.calls)


async def test_message_without_original_topic_is_dead_lettered(forwarder: Any) -> None:
    consumer = FakeConsumer()
    await forwarder.handle(consumer, FakeMessage(5, [("avcc-target-group", b"review")]))
    assert [s[0] for s in forwarder._producer.sent] == ["topic.system.dlq"]
    assert consumer.calls == [("commit", [(0, 6)])]


async def test_target_filter_skips_other_groups(forwarder: Any) -> None:
    forwarder.target_groups = frozenset({"chain"})
    consumer = FakeConsumer()
    await forwarder.handle(consumer, FakeMessage(5, retry_headers(None, target=b"review")))
    assert forwarder._producer.sent == []
    assert consumer.calls == [("commit", [(0, 6)])]
