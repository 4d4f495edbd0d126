"""Records by status kept in memory: rebuilt by a scan that races real writes, moved by writes,
and merged over replicas with the silent ones named."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator

import pytest

from app.lifecycle.code.records import HISTORY_LIMIT, HistoryEntry, RecordState, capped
from app.lifecycle.code.status_counts import ReplicaCounts, StatusCounts, merge_replicas, stored_status
from app.lifecycle.code.time_to_code import waiting_since

STATUSES = ("submitted", "need_human", "approved", "issued", "rejected", "chain_failed")


class Store:
    """Record partitions like the code worker's RocksDB store: each partition is read from a
    snapshot taken when an iteration reaches it, and every write reports its move."""

    def __init__(self, counts: StatusCounts, partitions: int = 3) -> None:
        self.counts = counts
        self.dbs: list[dict[str, bytes]] = [{} for _ in range(partitions)]
        self.now_ms = 0

    def write(self, record_id: int, status: str) -> None:
        key = str(record_id)
        db = self.dbs[record_id % len(self.dbs)]
        raw = db.get(key)
        old = RecordState.model_validate_json(raw) if raw else None
        before = old or RecordState(avcc_record_id=record_id)
        self.now_ms += 1
        event_id = f"{key}-{len(before.history)}"
        entry = HistoryEntry(at_ms=self.now_ms, status=status, event="e", event_id=event_id)
        update = {
            "status": status,
            "history": capped((*before.history, entry)),
            "transitions": before.transitions + 1,
            "updated_ms": self.now_ms,
        }
        new = before.model_copy(update=update)
        db[key] = new.model_dump_json().encode()
        self.counts.moved(key, old.status if old else None, status, new.transitions, waiting_since(new))

    def records(self) -> list[RecordState]:
        return [RecordState.model_validate_json(raw) for db in self.dbs for raw in db.values()]

    def oldest_waiting(self) -> int | None:
        return min((s for r in self.records() if (s := waiting_since(r)) is not None), default=None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        for db in self.dbs:
            snapshot = dict(db)
            yield from ((key.encode(), raw) for key, raw in snapshot.items())

    def truth(self) -> dict[str, int]:
        found = Counter(record.status for record in self.records())
        return dict(sorted(found.items()))


def test_stored_status_is_the_records_own() -> None:
    """``status`` precedes every nested field of a stored record, so the first one found is its."""
    assert list(RecordState.model_fields)[:2] == ["avcc_record_id", "status"]
    history = (HistoryEntry(at_ms=1, status="submitted", event="apply.created", event_id="x"),)
    record = RecordState(avcc_record_id=7, status="issued", history=history)
    assert stored_status(record.model_dump_json().encode()) == "issued"
    assert stored_status(b"{}") is None


async def test_counts_are_rebuilt_then_moved_by_writes() -> None:
    counts = StatusCounts(slice_size=4)
    store = Store(counts)
    for record_id in range(1, 21):
        store.write(record_id, STATUSES[record_id % 3])
    assert counts.snapshot() is None  # nothing counted before the first rebuild
    assert await counts.rebuild([0, 2, 4], store.items)
    assert counts.snapshot() == ((0, 2, 4), store.truth())
    assert counts.oldest_waiting_ms() == store.oldest_waiting() == 1  # record 1 waits since the first write
    store.write(1, "issued")
    store.write(99, "submitted")
    store.write(98, "need_human")
    store.write(98, "need_human")  # still waiting, since its first need_human write
    assert counts.snapshot() == ((0, 2, 4), store.truth())
    assert counts.oldest_waiting_ms() == store.oldest_waiting() == 4  # record 4, since the 4th write
    for record_id in range(1, 21):
        store.write(record_id, "issued")
    assert counts.oldest_waiting_ms() == store.oldest_waiting() == 23  # record 98, since its first
    store.write(98, "approved")
    assert counts.oldest_waiting_ms() is None and store.oldest_waiting() is None
    counts.invalidate()
    assert counts.snapshot() is None and not counts.ready and counts.oldest_waiting_ms() is None


@pytest.mark.parametrize("seed", range(40))
async def test_a_scan_racing_writes_counts_each_record_once(seed: int) -> None:
    """Writes land between the scan's slices, on partitions read before or after, on records
    read before or after, twice on one record: the result is what the store holds at the end,
    the oldest wait for a person included."""
    rng = random.Random(seed)
    counts = StatusCounts(slice_size=rng.choice([1, 3, 7]))
    store = Store(counts, partitions=rng.choice([1, 3, 6]))
    for record_id in range(1, 61):
        store.write(record_id, rng.choice(STATUSES))

    async def writer() -> None:
        for _ in range(120):
            store.write(rng.randint(1, 90), rng.choice(STATUSES))
            if rng.random() < 0.5:
                await asyncio.sleep(0)

    built, _ = await asyncio.gather(counts.rebuild([0, 1], store.items), writer())
    assert built
    assert counts.snapshot() == ((0, 1), store.truth())
    assert counts.oldest_waiting_ms() == store.oldest_waiting()


@pytest.mark.parametrize("seed", range(10))
async def test_a_scan_racing_writes_to_records_past_their_history_limit_counts_each_once(seed: int) -> None:
    """Records whose history is capped still show every write as a new version."""
    rng = random.Random(seed)
    counts = StatusCounts(slice_size=rng.choice([1, 2, 3]))
    store = Store(counts, partitions=3)
    for record_id in range(1, 7):
        for _ in range(HISTORY_LIMIT + 2):
            store.write(record_id, rng.choice(STATUSES))

    async def writer() -> None:
        for _ in range(60):
            store.write(rng.randint(1, 6), rng.choice(STATUSES))
            await asyncio.sleep(0)

    built, _ = await asyncio.gather(counts.rebuild([0, 1, 2], store.items), writer())
    assert built
    assert counts.snapshot() == ((0, 1, 2), store.truth())


async def test_a_rebalance_during_the_scan_gives_it_up() -> None:
    counts = StatusCounts(slice_size=2)
    store = Store(counts)
    for record_id in range(1, 30):
        store.write(record_id, "submitted")

    async def rebalance() -> None:
        await asyncio.sleep(0)
        counts.invalidate()

    built, _ = await asyncio.gather(counts.rebuild([0], store.items), rebalance())
    assert not built and counts.snapshot() is None
    assert await counts.rebuild([1], store.items)
    assert counts.snapshot() == ((1,), {"submitted": 29})


def test_merge_sums_the_replicas_that_answered_and_names_the_others() -> None:
    body = merge_replicas(
        [
            ReplicaCounts("http://127.0.0.2:6067", (1, 3, 5), error="answered 503: owner unreachable"),
            ReplicaCounts("http://127.0.0.1:6067", (0, 2), {"need_human": 2, "issued": 1}),
        ],
        partitions=6,
    )
    assert body["counts"] == {"issued": 1, "need_human": 2}
    assert body["missing_partitions"] == [1, 3, 4, 5]  # 4: no owner at all
    assert body["truncated"] is False and body["partitions"] == 6
    assert [r["url"] for r in body["replicas"]] == ["http://127.0.0.1:6067", "http://127.0.0.2:6067"]
    silent = body["replicas"][1]
    assert silent == {
        "url": "http://127.0.0.2:6067",
        "partitions": [1, 3, 5],
        "answered": False,
        "error": "answered 503: owner unreachable",
    }
    assert ReplicaCounts.from_json(body["replicas"][0]).counts == {"need_human": 2, "issued": 1}
