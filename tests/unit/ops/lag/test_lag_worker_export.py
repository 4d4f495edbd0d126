"""Per-worker lag export and readiness views (``install_common_views``) over fake faust apps."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP

from app.platform.faust.readiness import WorkerState, readiness
from app.platform.http.views import install_common_views
from app.platform.lag.export import WorkerLagExporter
from app.platform.lag.settings import LagReadSettings
from app.platform.lag.snapshot import PartitionOffsets
from tests.unit.ops.lag.lag_samples import sample

# ----------------------------------------------------------------------------- worker views


class FakeConsumer:
    def __init__(self, assignment: set[Any] | None) -> None:
        self._assignment = assignment
        self.randomly_assigned_topics = {"avcc-x-__assignor-__leader"}

    def assignment(self) -> set[Any]:
        if self._assignment is None:
            raise RuntimeError("ConsumerNotStarted")
        return self._assignment


def fake_app(assignment: set[Any] | None, *, completed: bool = True, agents: bool = True) -> Any:
    event = asyncio.Event()
    if completed:
        event.set()
    tables = SimpleNamespace(
        recovery=SimpleNamespace(completed=event), changelog_topics={"avcc-x-t-changelog"}
    )
    return SimpleNamespace(
        crashed=False,
        in_recovery=False,
        agents={"a": 1} if agents else {},
        tables=tables,
        conf=SimpleNamespace(reply_to="avcc-x-replies"),
        consumer=FakeConsumer(assignment),
    )


def tp(topic: str, partition: int) -> TP:
    return TP(topic, partition)


def test_ready_states() -> None:
    state = WorkerState("x", consumer=True, started=False)
    assert readiness(fake_app({tp("a", 0)}), state)[1]["status"] == "starting"
    state.started = True
    assert readiness(fake_app(None), state)[1]["status"] == "starting"
    assert readiness(fake_app(set()), state)[1]["status"] == "unassigned"
    assert readiness(fake_app({tp("a", 0)}, completed=False), state)[1]["status"] == "recovering"
    ok, body = readiness(fake_app({tp("a", 0)}), state)
    assert ok and body["partitions"] == 1
    # a group without a Kafka consumer (gateway) is ready once started
    assert readiness(fake_app(None, agents=False), WorkerState("gateway", consumer=False, started=True))[0]


def test_ready_follows_a_groups_own_consumer_and_check() -> None:
    owned: list[tuple[str, int]] = []
    healthy = [False]
    state = WorkerState(
        "sink",
        consumer=False,
        started=True,
        assignment=lambda: owned,
        ready_check=lambda: (healthy[0], "clickhouse down"),
    )
    app = fake_app(None, agents=False)
    assert readiness(app, state)[1]["status"] == "unassigned"
    owned.append(("topic.playback.event", 3))
    assert readiness(app, state)[1] == {"group": "sink", "status": "not_ready", "reason": "clickhouse down"}
    healthy[0] = True
    assert readiness(app, state) == (
        True,
        {"group": "sink", "status": "ready", "consumer": True, "partitions": 1},
    )


async def test_worker_exporter_exports_only_its_source_partitions_and_drops_revoked() -> None:
    app = fake_app(
        {
            tp("src-unit", 0),
            tp("src-unit", 3),
            tp("avcc-x-t-changelog", 0),
            tp("avcc-x-__assignor-__leader", 0),
            tp("avcc-x-replies", 0),
        }
    )
    calls: list[tuple[str, list[tuple[str, int]]]] = []

    class Reader:
        def group_offsets(self, group: str, tps: list[tuple[str, int]]) -> list[PartitionOffsets]:
            calls.append((group, list(tps)))
            return [PartitionOffsets(group, t, p, 100, 40) for t, p in tps]

        def close(self) -> None:
            pass

    exporter = WorkerLagExporter(app, "xunit", reader_factory=Reader)  # type: ignore[arg-type]
    await exporter.export_once()
    assert calls == [("avcc-xunit", [("src-unit", 0), ("src-unit", 3)])]
    assert sample("avcc_consumer_lag_messages", group="avcc-xunit", topic="src-unit", partition="3") == 60
    app.consumer._assignment = {tp("src-unit", 0)}  # partition 3 revoked
    await exporter.export_once()
    assert sample("avcc_consumer_lag_messages", group="avcc-xunit", topic="src-unit", partition="3") is None
    exporter.close()
    assert sample("avcc_consumer_lag_messages", group="avcc-xunit", topic="src-unit", partition="0") is None


def test_install_common_views_registers_routes_and_turns_an_idle_consumer_off() -> None:
    idle = faust.App("avcc-unit-idle", broker="kafka://127.0.0.1:1", autodiscover=False)
    state = install_common_views(idle, "unit-idle")
    assert {"/metrics", "/health", "/ready"} <= set(idle.web.views)
    assert install_common_views(idle, "unit-idle") is state  # idempotent
    idle.on_worker_init.send()
    assert state.consumer is False and idle.boot_strategy.enable_kafka_consumer is False

    busy = faust.App("avcc-unit-busy", broker="kafka://127.0.0.1:1", autodiscover=False)

    @busy.agent(busy.topic("unit-busy-topic"))
    async def agent(stream: Any) -> None:
        async for _ in stream:
            pass

    busy_state = install_common_views(busy, "unit-busy", export_lag=False)
    busy.on_worker_init.send()
    assert busy_state.consumer is True and busy.boot_strategy.enable_kafka_consumer is not False


async def test_worker_exporter_follows_a_groups_own_consumer() -> None:
    class Reader:
        def group_offsets(self, group: str, tps: list[tuple[str, int]]) -> list[PartitionOffsets]:
            return [PartitionOffsets(group, t, p, 10, 4) for t, p in tps]

        def close(self) -> None:
            pass

    app = fake_app(None, agents=False)
    exporter = WorkerLagExporter(
        app,
        "ownunit",
        reader_factory=Reader,  # type: ignore[arg-type]
        assignment=lambda: [("own-unit", 2)],
    )
    rows = await exporter.export_once()
    assert [(r.topic, r.partition, r.lag) for r in rows] == [("own-unit", 2, 6)]
    assert sample("avcc_consumer_lag_messages", group="avcc-ownunit", topic="own-unit", partition="2") == 6
    exporter.close()


async def test_a_reading_that_never_answers_is_given_up_and_the_next_round_asks_a_new_reader() -> None:
    """Seen after a broker restart: the reader's committed() never returned, and every later
    round (and the stall watchdog fed by them) waited behind it."""
    release = threading.Event()
    readers: list[Any] = []

    class Reader:
        def __init__(self) -> None:
            self.hangs = not readers  # the first reader's call does not return until released
            self.closed = False
            readers.append(self)

        def group_offsets(self, group: str, tps: list[tuple[str, int]]) -> list[PartitionOffsets]:
            if self.hangs:
                release.wait(10)
                raise RuntimeError("committed() returned late")
            return [PartitionOffsets(group, t, p, 10, 7) for t, p in tps]

        def close(self) -> None:
            self.closed = True

    app = fake_app({tp("hang-unit", 0)})
    exporter = WorkerLagExporter(
        app,
        "hangunit",
        config=LagReadSettings(request_timeout_s=0.05),
        reader_factory=Reader,  # type: ignore[arg-type]
    )
    assert exporter.export_timeout_s() == pytest.approx(0.15)
    assert await asyncio.wait_for(exporter.export_once(), 2) == []
    rows = await asyncio.wait_for(exporter.export_once(), 2)
    assert [(r.topic, r.lag) for r in rows] == [("hang-unit", 3)]
    assert len(readers) == 2
    assert not readers[0].closed, "closed under the call that still uses it"
    release.set()
    for _ in range(100):
        if readers[0].closed:
            break
        await asyncio.sleep(0.02)
    assert readers[0].closed and not readers[1].closed
    exporter.close()
    assert readers[1].closed
