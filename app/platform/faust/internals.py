"""The private parts of faust-streaming and aiokafka this project still relies on, all here.

The core groups own their input offsets (:mod:`app.platform.faust.batches`): they decide what
is processed and commit it themselves. faust 0.15 has no public call to commit chosen offsets
nor to read a partition's committed offset (its ``Consumer.commit`` commits only what its own
ack bookkeeping holds, which the core groups turn off). Both go through the aiokafka consumer
that faust runs in its consumer thread:

* ``ThreadDelegateConsumer._thread`` -- faust's consumer thread, whose public ``call_thread``
  runs a coroutine on the thread's event loop (aiokafka's consumer lives there);
* ``AIOKafkaConsumerThread._ensure_consumer()`` -- that thread's aiokafka consumer, whose public
  ``commit()`` and ``committed()`` are then used; faust's public ``Consumer.seek`` is run there too
  (:func:`seek`): from the worker's loop it moved aiokafka's fetcher while the consumer thread
  was reading its records (``KeyError`` in ``Fetcher.fetched_records``: the worker crashed);
* that consumer's (and its fetcher's) ``_fetch_min_bytes`` and ``_fetch_max_wait_ms``: faust creates the
  consumer with aiokafka's ``fetch_min_bytes=1`` and a hard-coded ``fetch_max_wait_ms=1500`` and offers no
  setting for either, so every message arriving alone made a fetch of its own (measured: ~1.1 ms of a
  worker's CPU per event at 150 events/s, 0.37 ms with fetches of at least 64 KiB or 50 ms).

And faust's RocksDB ``Store._dbs``, its open partition databases, whose memtables
:func:`flush_stores` flushes: faust never flushes nor closes them, so a table sat in RocksDB's
write-ahead log, replayed at the next open, inside faust's rebalance callback (no heartbeats):
11 s for a code worker with a million works after a SIGKILL, past its session timeout.

Nothing else of faust or aiokafka is overridden or read from outside its public API. The shape
these names rely on is checked when this module is imported (:func:`check_shape`), and the
versions it was checked against are pinned in ``setup.cfg``; an upgrade that changes either
fails the import (and ``tests/unit/platform/test_internals.py``) instead of failing a commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib.metadata import version
from typing import Any, Final

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.structs import OffsetAndMetadata
from faust.stores.rocksdb import Store as RocksDBStore
from faust.transport.consumer import ThreadDelegateConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP
from rocksdict import Rdict

from app.platform.errors import AvccError

__all__ = [
    "PINNED",
    "ShapeChanged",
    "check_shape",
    "commit",
    "committed",
    "flush_stores",
    "seek",
    "tune_fetches",
]

#: The versions whose internals this module was written against (also pinned in setup.cfg).
PINNED: Final = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0"}


class ShapeChanged(AvccError, ImportError):
    """faust or aiokafka no longer has the shape this module relies on: read the module's
    docstring, check the new version's consumer thread, then update this module and its pins."""


def check_shape() -> None:
    """Raise :class:`ShapeChanged` unless the pinned versions and the private names are there."""
    for package, pinned in PINNED.items():
        installed = version(package)
        if installed != pinned:
            raise ShapeChanged(f"{package} {installed} is installed; {__name__} was checked against {pinned}")
    if "_thread" not in getattr(ThreadDelegateConsumer, "__annotations__", {}):
        raise ShapeChanged("faust's ThreadDelegateConsumer no longer declares its _thread")
    for name in ("_ensure_consumer", "call_thread"):
        if not callable(getattr(AIOKafkaConsumerThread, name, None)):
            raise ShapeChanged(f"faust's AIOKafkaConsumerThread has no {name}()")
    if "_dbs" not in getattr(RocksDBStore, "__annotations__", {}) or not hasattr(Rdict, "flush"):
        raise ShapeChanged("faust's RocksDB Store has no _dbs, or rocksdict's Rdict no flush()")
    for cls in (AIOKafkaConsumer, Fetcher):
        stored = cls.__init__.__code__.co_names
        if not {"_fetch_min_bytes", "_fetch_max_wait_ms"} <= set(stored):
            raise ShapeChanged(
                f"aiokafka's {cls.__name__} no longer keeps _fetch_min_bytes/_fetch_max_wait_ms"
            )


check_shape()


def _thread(app: Any) -> Any:
    """faust's consumer thread of ``app`` (started: the worker is running)."""
    return app.consumer._thread


async def commit(app: Any, offsets: Mapping[TP, int]) -> None:
    """Commit ``offsets`` (the next offset to read, per partition) for ``app``'s group.

    Raises what aiokafka raises: ``CommitFailedError`` after a rebalance (the partitions'
    new owner processes the uncommitted events again), a ``KafkaError`` when the coordinator
    cannot be reached.
    """
    if not offsets:
        return
    thread = _thread(app)
    consumer = thread._ensure_consumer()
    wanted = {
        KafkaTP(tp.topic, tp.partition): OffsetAndMetadata(offset, "") for tp, offset in offsets.items()
    }
    await thread.call_thread(consumer.commit, wanted)


async def committed(app: Any, tps: Iterable[TP]) -> dict[TP, int | None]:
    """The group's committed offset of each of ``tps`` (``None``: never committed)."""
    thread = _thread(app)
    consumer = thread._ensure_consumer()
    found: dict[TP, int | None] = {}
    for tp in tps:
        offset = await thread.call_thread(consumer.committed, KafkaTP(tp.topic, tp.partition))
        found[tp] = int(offset) if offset is not None and offset >= 0 else None
    return found


async def seek(app: Any, tp: TP, offset: int) -> None:
    """Fetch ``tp`` from ``offset`` next: faust's public ``Consumer.seek`` (which also resets the
    offset faust drops older messages below), run on faust's consumer thread, where aiokafka's
    fetcher lives, so a seek never changes the fetcher's records while that thread reads them."""
    await _thread(app).call_thread(app.consumer.seek, tp, offset)


def tune_fetches(app: Any, min_bytes: int, max_wait_ms: int) -> None:
    """Make ``app``'s consumer fetch at least ``min_bytes`` or wait ``max_wait_ms`` (its fetcher
    now, and any fetcher it creates later)."""
    consumer = _thread(app)._ensure_consumer()
    for holder in (consumer, getattr(consumer, "_fetcher", None)):
        if holder is not None:
            holder._fetch_min_bytes = min_bytes
            holder._fetch_max_wait_ms = max_wait_ms


def flush_stores(table: Any) -> int:
    """Flush the memtables of every open partition database of ``table``'s RocksDB store (a
    blocking call: run it in a thread); how many were flushed."""
    databases = list(getattr(table.data, "_dbs", {}).values())
    for database in databases:
        database.flush(wait=True)
    return len(databases)
