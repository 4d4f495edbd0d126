"""The ``/records`` operator page: a bounded scan that shares the event loop with the agents."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from app.lifecycle.code.recent import recent_records, render_recent_records
from app.lifecycle.code.records import RecordState


def stored(record_id: int, updated_ms: int | None, avcc_code: str | None = None) -> bytes:
    state = RecordState(avcc_record_id=record_id, updated_ms=updated_ms, avcc_code=avcc_code)
    return state.model_dump_json().encode()


async def test_newest_records_first_and_only_as_many_as_shown() -> None:
    values = [stored(i, 1_000 + (i * 7919) % 500) for i in range(1, 301)]
    values += [b"", b"{not json", stored(999, None)]
    recent = await recent_records(values, shown=10)
    expected = sorted(range(1, 301), key=lambda i: 1_000 + (i * 7919) % 500, reverse=True)[:10]
    assert [s.avcc_record_id for s in recent.records] == expected
    assert recent.scanned == len(values) and not recent.truncated


async def test_the_scan_stops_at_its_limit_and_says_so() -> None:
    consumed = 0

    def table() -> Iterator[bytes]:
        nonlocal consumed
        for i in range(1, 10_001):
            consumed += 1
            yield stored(i, i)

    recent = await recent_records(table(), shown=3, scan_limit=1_000, slice_size=100)
    assert recent.scanned == 1_000 and recent.truncated
    assert consumed <= 1_001  # the rest of the table is never read
    assert [s.avcc_record_id for s in recent.records] == [1_000, 999, 998]
    assert "Scanned the first 1000 stored records only" in render_recent_records(recent)


async def test_the_scan_yields_to_the_event_loop_between_slices() -> None:
    ticks = 0
    stop = asyncio.Event()

    async def agent() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(agent())
    await asyncio.sleep(0)
    before = ticks
    await recent_records((stored(i, i) for i in range(1, 2_001)), slice_size=100)
    stop.set()
    await other
    assert ticks - before >= 19  # the other task ran between (almost) every one of the 20 slices


async def test_the_page_escapes_every_value() -> None:
    page = render_recent_records(await recent_records([stored(1, 5, "<script>x</script>")]))
    assert "<script>x" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
