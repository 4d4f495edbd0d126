"""Typed tables keep the bytes the untyped tables stored (UTF-8 keys, JSON values)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.platform.faust.tables import ModelTable, model_table, parking_table


class Item(BaseModel):
    name: str
    count: int = 0


class FakeApp:
    def __init__(self) -> None:
        self.declared: list[tuple[str, dict[str, Any]]] = []

    def Table(self, name: str, **options: Any) -> dict[bytes, bytes]:
        self.declared.append((name, options))
        return {}


def test_models_in_bytes_stored() -> None:
    raw: dict[bytes, bytes] = {}
    table = ModelTable(raw, Item)
    assert table.get("a") is None
    table["a"] = Item(name="x", count=2)
    assert raw == {b"a": b'{"name":"x","count":2}'}
    assert table.get("a") == Item(name="x", count=2)
    raw[b"b"] = b'{"name":"y"}'
    raw[b"empty"] = b""
    assert sorted(i.name for i in table.values()) == ["x", "y"]


def test_declares_raw_tables_with_their_names() -> None:
    app = FakeApp()
    model_table(app, "records", Item, partitions=6, help="h")
    parking_table(app, "records", 6)
    assert [name for name, _ in app.declared] == ["records", "records-parked"]
    assert all(o["key_type"] is bytes and o["value_type"] is bytes for _, o in app.declared)
    assert app.declared[0][1]["partitions"] == 6
