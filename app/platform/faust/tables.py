"""Typed faust tables: ``str`` keys and pydantic models in and out, stored as raw bytes.

A :class:`ModelTable` keeps the on-disk format of the tables it replaced (UTF-8 key, the
model's JSON as value), so existing RocksDB stores and changelog topics read back unchanged.
The faust table itself stays reachable as ``.table`` (owner routing, changelog metadata).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

__all__ = ["ModelTable", "model_table", "parking_table"]

_M = TypeVar("_M", bound=BaseModel)


class ModelTable(Generic[_M]):
    """A view of a bytes->bytes faust table as ``str`` -> ``model``."""

    def __init__(self, table: Any, model: type[_M]) -> None:
        self.table = table
        self.model = model

    def get(self, key: str) -> _M | None:
        """The value of ``key``, ``None`` when absent."""
        raw = self.table.get(key.encode())
        return self.model.model_validate_json(raw) if raw else None

    def __setitem__(self, key: str, value: _M) -> None:
        self.table[key.encode()] = value.model_dump_json().encode()

    def values(self) -> Iterator[_M]:
        """Every value held by this worker's partitions."""
        for _, raw in self.table.items():
            if raw:
                yield self.model.model_validate_json(raw)


def model_table(app: Any, name: str, model: type[_M], *, partitions: int, help: str) -> ModelTable[_M]:
    """A new changelogged faust table ``name`` of ``app`` (changelog ``<app id>-<name>-changelog``)
    holding ``model`` values."""
    table = app.Table(name, partitions=partitions, key_type=bytes, value_type=bytes, help=help)
    return ModelTable(table, model)


def parking_table(app: Any, name: str, partitions: int) -> Any:
    """The changelogged table ``<name>-parked`` of message ids waiting in the retry path, per key,
    co-partitioned with its stream (see :meth:`GroupRuntime.process`)."""
    return app.Table(f"{name}-parked", partitions=partitions, key_type=bytes, value_type=bytes)
