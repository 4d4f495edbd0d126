"""Typed tables keep the bytes the untyped tables stored (UTF-8 keys, JSON values), read a batch's
staged writes first, and reach the local store only after their changelog writes are acked."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from app.platform.errors import DependencyUnavailable
from app.platform.faust.tables import (
    ModelTable,
    ParkedIds,
    Staged,
    model_table,
    parking_table,
    staging,
    write_durably,
)
from app.platform.kafka.producers import Delivery, Outbound


class Item(BaseModel):
    name: str
    count: int = 0


class FakeStore:
    """What the tables use of a faust store: ``get`` and ``apply_changelog_batch``."""

    def __init__(self, raw: dict[bytes, bytes]) -> None:
        self.raw = raw
        self.persisted: dict[Any, int] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.raw.get(key)

    def apply_changelog_batch(self, batch: Any, to_key: Any, to_value: Any) -> None:
        for event in batch:
            message = event.message
            if message.value is None:
                self.raw.pop(message.key, None)
            else:
                self.raw[message.key] = message.value
            self.persisted[message.tp] = message.offset


class FakeTable(dict[bytes, bytes]):
    """A bytes table with a changelog topic and a store, like faust's."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.data = FakeStore(self)
        self.changelog_topic = type(
            "Topic", (), {"get_topic_name": staticmethod(lambda: f"{name}-changelog")}
        )()


class FakeProducer:
    """Acknowledges every message at the next offset of its partition (or refuses them all)."""

    def __init__(self, refuse: bool = False) -> None:
        self.sent: list[Outbound] = []
        self.refuse = refuse
        self.offsets: dict[tuple[str, int], int] = {}

    async def send_batch(self, messages: list[Outbound]) -> list[Delivery]:
        if self.refuse:
            raise DependencyUnavailable("broker away")
        self.sent.extend(messages)
        deliveries = []
        for message in messages:
            where = (str(message.topic), int(message.partition or 0))
            offset = self.offsets.get(where, 0)
            self.offsets[where] = offset + 1
            deliveries.append(Delivery(where[0], where[1], offset))
        return deliveries


def test_models_in_bytes_stored() -> None:
    raw = FakeTable("t")
    table = ModelTable(raw, Item)
    assert table.get("a") is None
    raw[b"a"] = b'{"name":"x","count":2}'
    raw[b"b"] = b'{"name":"y"}'
    raw[b"empty"] = b""
    assert table.get("a") == Item(name="x", count=2)
    assert sorted(i.name for i in table.values()) == ["x", "y"]


async def test_staged_writes_are_read_first_and_reach_the_store_after_the_changelog() -> None:
    raw = FakeTable("app-items")
    table = ModelTable(raw, Item)
    raw[b"gone"] = b'{"name":"old"}'
    staged = Staged.empty()
    with staging(staged):
        staged.stage(table.write("a", Item(name="first")), partition=2)
        staged.stage(table.write("a", Item(name="second", count=1)), partition=2)
        staged.stage(table.write("gone", None), partition=1)
        assert table.get("a") == Item(name="second", count=1)
        assert table.get("gone") is None
    assert table.get("a") is None  # outside the batch: nothing applied yet
    producer = FakeProducer()
    await write_durably(producer, staged)  # type: ignore[arg-type]
    assert [(m.topic, m.key, m.value, m.partition) for m in producer.sent] == [
        ("app-items-changelog", b"a", b'{"name":"second","count":1}', 2),
        ("app-items-changelog", b"gone", None, 1),
    ]
    assert raw == {b"a": b'{"name":"second","count":1}'}
    assert sorted((tp.topic, tp.partition, o) for tp, o in raw.data.persisted.items()) == [
        ("app-items-changelog", 1, 0),
        ("app-items-changelog", 2, 0),
    ]


async def test_a_refused_changelog_write_leaves_the_store_untouched() -> None:
    raw = FakeTable("app-items")
    table = ModelTable(raw, Item)
    staged = Staged.empty()
    staged.stage(table.write("a", Item(name="x")), partition=0)
    with pytest.raises(DependencyUnavailable):
        await write_durably(FakeProducer(refuse=True), staged)  # type: ignore[arg-type]
    assert raw == {}


def test_declares_raw_tables_with_their_names() -> None:
    declared: list[tuple[str, dict[str, Any]]] = []

    class FakeApp:
        def Table(self, name: str, **options: Any) -> FakeTable:
            declared.append((name, options))
            return FakeTable(name)

    model_table(FakeApp(), "records", Item, partitions=6, help="h")
    parked = parking_table(FakeApp(), "records", 6)
    assert [name for name, _ in declared] == ["records", "records-parked"]
    assert all(o["key_type"] is bytes and o["value_type"] is bytes for _, o in declared)
    assert declared[0][1]["partitions"] == 6
    assert parked.model is ParkedIds
    assert ParkedIds(["t:0:1", "t:0:2"]).model_dump_json() == '["t:0:1","t:0:2"]'  # the old bytes
