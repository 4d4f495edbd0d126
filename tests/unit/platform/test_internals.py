"""The private parts of faust and aiokafka the project relies on live in one small module, which
refuses to import once the libraries change the shape it relies on."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP
from rocksdict import Options, Rdict

from app.platform.faust import internals

ROOT = Path(__file__).resolve().parents[3]
#: Private names of faust and aiokafka the earlier fork of faust's consumer overrode or read.
FORKED_NAMES = (
    "_add_gap",
    "_new_offset",
    "_filter_tps_with_pending_acks",
    "_read_offset",
    "_committed_offset",
    "_acked",
    "_gap",
    "_unacked_messages",
    "_drain_replies",
    "_send_pending",
    "_proc_fetch_request",
    "_fetch_max_wait_ms",
    "_paused_partitions",
    "_current_event",
    "_ensure_consumer",
)


def test_the_shape_holds_for_the_pinned_versions() -> None:
    internals.check_shape()
    setup = (ROOT / "setup.cfg").read_text()
    for package, version in internals.PINNED.items():
        assert re.search(rf"^\s*{re.escape(package)}=={re.escape(version)}\s*$", setup, re.M), package


def test_another_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internals, "version", lambda package: "9.9.9")
    with pytest.raises(internals.ShapeChanged, match=r"9\.9\.9"):
        internals.check_shape()


def test_a_missing_private_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(internals.AIOKafkaConsumerThread, "_ensure_consumer")
    with pytest.raises(internals.ShapeChanged, match="_ensure_consumer"):
        internals.check_shape()
    monkeypatch.undo()
    monkeypatch.setattr(internals.ThreadDelegateConsumer, "__annotations__", {})
    with pytest.raises(internals.ShapeChanged, match="_thread"):
        internals.check_shape()


def test_no_private_name_of_faust_or_aiokafka_is_used_outside_the_internals_module() -> None:
    module = ROOT / "app" / "platform" / "faust" / "internals.py"
    assert len(module.read_text().splitlines()) < 150
    pattern = re.compile(r"\.(" + "|".join(re.escape(n) for n in FORKED_NAMES) + r")\b")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("app", "agents", "tables")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != module
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


class _ConsumerThread:
    """faust's consumer thread as :func:`internals.seek` uses it: its own loop in its own thread,
    ``call_thread`` running a call there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def call_thread(self, fun: Any, *args: Any) -> Any:
        async def run() -> Any:
            return await fun(*args)

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self.loop))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def test_a_seek_runs_on_the_consumer_thread_where_aiokafka_reads_its_records() -> None:
    thread = _ConsumerThread()
    sought: list[tuple[TP, int, threading.Thread]] = []

    async def consumer_seek(tp: TP, offset: int) -> None:
        sought.append((tp, offset, threading.current_thread()))

    app = SimpleNamespace(consumer=SimpleNamespace(_thread=thread, seek=consumer_seek))
    try:
        await internals.seek(app, TP("topic.avcc.apply.created", 3), 26)
    finally:
        thread.stop()
    assert sought == [(TP("topic.avcc.apply.created", 3), 26, thread.thread)]


def test_a_store_without_its_partition_databases_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internals.RocksDBStore, "__annotations__", {})
    with pytest.raises(internals.ShapeChanged, match="_dbs"):
        internals.check_shape()


def test_flushing_a_store_moves_its_memtables_out_of_the_write_ahead_log(tmp_path: Path) -> None:
    database = Rdict(str(tmp_path / "records-0.db"), Options(raw_mode=True))
    try:
        for index in range(1000):
            database.put(f"key-{index}".encode(), b"x" * 100)
        assert not list(tmp_path.glob("records-0.db/*.sst"))  # all of it in the memtable and WAL
        table = SimpleNamespace(data=SimpleNamespace(_dbs={0: database}))
        assert internals.flush_stores(table) == 1
        assert list(tmp_path.glob("records-0.db/*.sst"))
    finally:
        database.close()
