"""Typed faust tables whose writes are staged in a batch and made durable changelog first.

A :class:`ModelTable` shows a bytes->bytes faust table as ``str`` -> pydantic model, with the
on-disk format of the tables it replaced (UTF-8 key, the model's JSON as value), so existing
RocksDB stores and changelog topics read back unchanged.

Writes never go through faust's ``table[key] = value`` (which writes RocksDB at once and sends
the changelog later through faust's producer buffer). A handler returns :class:`Write`\\ s; the
batch runtime stages them (:func:`staging`: later events of the same batch read them), and once
the batch's outputs are acknowledged :func:`write_durably` sends each key's last value to the
table's changelog with the core producer, waits for the acks, and only then applies them to the
local RocksDB store through its public ``apply_changelog_batch`` (which also records the
changelog offsets it holds, as faust's recovery does). Local state is therefore never ahead of
its changelog: a crash at any point loses nothing a new owner would not recover.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from faust.types import TP
from pydantic import BaseModel, RootModel

from app.platform.kafka.producers import EventProducer, Outbound

__all__ = [
    "PARKED_SUFFIX",
    "ChangelogEvent",
    "ModelTable",
    "ParkedIds",
    "Staged",
    "Write",
    "model_table",
    "parking_table",
    "same",
    "staging",
    "write_durably",
]

_M = TypeVar("_M", bound=BaseModel)


class ParkedIds(RootModel[list[str]]):
    """Message ids of a key waiting in the retry path, oldest first (see the parking lot)."""


@dataclass(frozen=True, slots=True)
class Write:
    """A new value (``None``: delete) for ``key`` of ``table``, not applied yet."""

    table: ModelTable[Any]
    key: str
    value: BaseModel | None


@dataclass(slots=True)
class Staged:
    """A batch's staged writes: the latest value per (table, key) and the partition it is in
    (the partition of the event that wrote it, as faust's tables are co-partitioned)."""

    values: dict[tuple[int, str], tuple[ModelTable[Any], int, BaseModel | None]]

    @classmethod
    def empty(cls) -> Staged:
        """No writes yet."""
        return cls({})

    def stage(self, write: Write, partition: int) -> None:
        """Stage ``write`` (later reads of the same batch see it)."""
        self.values[(id(write.table), write.key)] = (write.table, partition, write.value)

    def lookup(self, table: ModelTable[Any], key: str) -> tuple[bool, BaseModel | None]:
        """``(staged, value)`` of ``key`` in ``table``."""
        found = self.values.get((id(table), key))
        return (False, None) if found is None else (True, found[2])

    def __bool__(self) -> bool:
        return bool(self.values)


_STAGED: contextvars.ContextVar[Staged | None] = contextvars.ContextVar("avcc_staged_writes", default=None)


@contextmanager
def staging(staged: Staged) -> Iterator[Staged]:
    """Make table reads in this context (and the tasks it starts) see ``staged`` first."""
    token = _STAGED.set(staged)
    try:
        yield staged
    finally:
        _STAGED.reset(token)


class ModelTable(Generic[_M]):
    """A view of a bytes->bytes faust table as ``str`` -> ``model``."""

    def __init__(self, table: Any, model: type[_M]) -> None:
        self.table = table
        self.model = model

    def get(self, key: str) -> _M | None:
        """The value of ``key`` (a write staged by the running batch first), ``None`` when absent."""
        staged = _STAGED.get()
        if staged is not None:
            found, value = staged.lookup(self, key)
            if found:
                return value  # type: ignore[return-value]
        raw = self.table.data.get(key.encode())  # the store: one lookup (the table's get makes two)
        return self.model.model_validate_json(raw) if raw else None

    def write(self, key: str, value: _M | None) -> Write:
        """The write of ``value`` to ``key`` (``None`` deletes), for a handler to return."""
        return Write(self, key, value)

    def values(self) -> Iterator[_M]:
        """Every value held by this worker's partitions."""
        for _, raw in self.table.items():
            if raw:
                yield self.model.model_validate_json(raw)

    @property
    def changelog(self) -> str:
        """The table's changelog topic."""
        return str(self.table.changelog_topic.get_topic_name())


class ChangelogEvent:
    """A changelog message as faust's stores read it in ``apply_changelog_batch``
    (``event.message.tp`` ... ``.value``): it is its own ``message``."""

    __slots__ = ("key", "offset", "partition", "tp", "value")

    def __init__(self, tp: TP, offset: int, key: bytes, value: bytes | None) -> None:
        self.tp = tp
        self.partition = tp.partition
        self.offset = offset
        self.key = key
        self.value = value

    @property
    def message(self) -> ChangelogEvent:
        """faust's events carry their message; this one is both."""
        return self


def same(value: Any) -> Any:
    """The identity: a changelog's raw key and value are what the stores hold."""
    return value


async def write_durably(producer: EventProducer, staged: Staged) -> None:
    """Send every staged value to its table's changelog, wait for the acks, then apply them to
    the local stores (with the changelog offsets they got). Raises if the broker refused one
    (nothing is then applied locally: the batch is processed again)."""
    if not staged:
        return
    entries = list(staged.values.values())
    keys = [key.encode() for (_, key) in staged.values]
    messages = [
        Outbound(
            table.changelog,
            value.model_dump_json().encode() if value is not None else None,
            key,
            None,
            partition,
        )
        for (table, partition, value), key in zip(entries, keys, strict=True)
    ]
    deliveries = await producer.send_batch(messages)
    by_table: dict[int, tuple[ModelTable[Any], list[ChangelogEvent]]] = {}
    for (table, _, _), message, delivery in zip(entries, messages, deliveries, strict=True):
        tp = TP(delivery.topic, delivery.partition)
        logged = ChangelogEvent(tp, delivery.offset, message.key or b"", message.value)
        by_table.setdefault(id(table), (table, []))[1].append(logged)
    for table, logged_writes in by_table.values():
        table.table.data.apply_changelog_batch(logged_writes, to_key=same, to_value=same)


def model_table(app: Any, name: str, model: type[_M], *, partitions: int, help: str) -> ModelTable[_M]:
    """A new changelogged faust table ``name`` of ``app`` (changelog ``<app id>-<name>-changelog``)
    holding ``model`` values."""
    table = app.Table(name, partitions=partitions, key_type=bytes, value_type=bytes, help=help)
    return ModelTable(table, model)


#: Suffix of the table that parks a stream's message ids behind a retry (``<name>-parked``).
PARKED_SUFFIX: Final = "-parked"


def parking_table(app: Any, name: str, partitions: int) -> ModelTable[ParkedIds]:
    """The changelogged table ``<name>-parked`` of message ids waiting in the retry path, per key,
    co-partitioned with its stream (see :mod:`app.platform.faust.runtime`)."""
    return model_table(
        app,
        f"{name}{PARKED_SUFFIX}",
        ParkedIds,
        partitions=partitions,
        help=f"Events of {name} parked behind a retry",
    )
