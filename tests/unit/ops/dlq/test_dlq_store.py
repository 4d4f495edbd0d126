"""DLQ store: persistence, idempotent indexing, audit trail, re-injection cap, filters."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.ops.dlq.entries import DiscardRefused, DlqError, DlqNotFound, ReinjectRefused
from app.ops.dlq.filters import DlqFilter
from app.ops.dlq.reinject import HEADER_REINJECTED_BY, HEADER_REINJECTED_COUNT, reinject_headers
from app.ops.dlq.store import DlqStore
from tests.unit.ops.dlq.dead_letters import T0, FakeSender, dead_letter

# -- store -------------------------------------------------------------------------------------


def test_index_keeps_raw_message_and_parses_metadata(store: DlqStore) -> None:
    dlq_id = dead_letter(store, 7, partition=2, event_id="ev-1")
    assert dlq_id == "2-7"
    entry = store.get("2-7")
    assert entry.status == "new"
    assert entry.key == b"10042"
    assert orjson.loads(entry.value)["event_id"] == "ev-1"
    assert entry.header("trace-id") == b"abc"
    assert entry.metadata is not None and entry.metadata.consumer_group == "review"
    assert entry.error_class == "app.platform.errors.DependencyTimeout"
    assert entry.failed_at_ms == T0
    assert store.next_offsets() == {2: 8}
    assert store.counts() == {"new": 1, "reinjected": 0, "discarded": 0}


def test_index_is_idempotent_per_position(store: DlqStore) -> None:
    dead_letter(store, 1)
    entry = store.get("0-1")
    again, new = store.index(0, 1, entry.timestamp_ms, entry.key, entry.value, entry.headers)
    assert not new and again.dlq_id == "0-1"
    assert len(store.list()) == 1


def test_a_different_record_at_a_known_position_gets_its_own_id(store: DlqStore) -> None:
    dead_letter(store, 1)
    entry, new = store.index(0, 1, T0, b"k", b"other bytes", [])
    assert new and entry.dlq_id == "0-1-1"
    assert entry.metadata is None and entry.metadata_error  # no failure headers at all
    assert entry.error_class == "unknown"


def test_undecodable_payload_is_kept_as_bytes(store: DlqStore) -> None:
    dead_letter(store, 1, value=b"\xff\xfe\x00garbage", key=None)
    entry = store.get("0-1")
    assert entry.value == b"\xff\xfe\x00garbage"
    kind, text = entry.payload_text()
    assert kind == "base64" and base64.b64decode(text) == b"\xff\xfe\x00garbage"


def test_status_and_audit_survive_reopen(tmp_path: Path, sender: FakeSender) -> None:
    path = tmp_path / "dlq"
    with DlqStore(path, sender=sender) as store:
        dead_letter(store, 1, event_id="a")
        dead_letter(store, 2, event_id="b")
        asyncio.run(store.reinject("0-1", "alice", reason="fixed the bug"))
        asyncio.run(store.discard("0-2", "bob", "test data from a load test"))
    with DlqStore(path) as reopened:
        first, second = reopened.get("0-1"), reopened.get("0-2")
        assert first.status == "reinjected" and first.reinjected_count == 1
        assert [(a.who, a.action, a.reason) for a in first.audit] == [("alice", "reinject", "fixed the bug")]
        assert first.audit[0].detail is not None and "re-injection 1" in first.audit[0].detail
        assert second.status == "discarded"
        assert [(a.who, a.action, a.reason) for a in second.audit] == [
            ("bob", "discard", "test data from a load test")
        ]
        assert reopened.counts() == {"new": 0, "reinjected": 1, "discarded": 1}
        assert reopened.next_offsets() == {0: 3}
        assert reopened.reinjections_of(first) == 1


async def test_reinject_produces_same_key_and_value_with_clean_headers(
    store: DlqStore, sender: FakeSender
) -> None:
    dlq_id = dead_letter(
        store, 1, extra_headers=[("avcc-target-group", b"review"), ("avcc-retry-round", b"1")]
    )
    entry = await store.reinject(dlq_id, "alice")
    [(topic, value, key, headers, partition)] = sender.sent
    original = store.get(dlq_id)
    assert topic == "topic.avcc.apply.created"
    assert value == original.value and key == b"10042"
    assert partition is None  # keyed: the partitioner puts it where the key's events are
    names = [name for name, _ in headers]
    assert ("trace-id", b"abc") in headers
    assert not any(
        n.startswith("avcc-")
        for n in names
        if n not in {HEADER_REINJECTED_BY, "avcc-reinjected-at", HEADER_REINJECTED_COUNT}
    )
    assert dict(headers)[HEADER_REINJECTED_BY] == b"alice"
    assert dict(headers)[HEADER_REINJECTED_COUNT] == b"1"
    assert int(dict(headers)["avcc-reinjected-at"]) > T0
    assert entry.status == "reinjected"


async def test_reinject_without_key_keeps_the_original_partition(store: DlqStore, sender: FakeSender) -> None:
    dlq_id = dead_letter(store, 1, key=None)
    await store.reinject(dlq_id, "alice")
    assert sender.sent[0][4] == 3


async def test_reinject_cap_counts_every_generation_of_the_event(store: DlqStore, sender: FakeSender) -> None:
    # the same event dead-lettered again after each re-injection (new DLQ records, same event id)
    for offset in range(1, 4):
        dlq_id = dead_letter(store, offset, event_id="same-event")
        await store.reinject(dlq_id, "alice")
    fourth = dead_letter(store, 4, event_id="same-event")
    with pytest.raises(ReinjectRefused, match="already re-injected 3 times"):
        await store.reinject(fourth, "alice")
    assert len(sender.sent) == 3
    assert [dict(h)[HEADER_REINJECTED_COUNT] for _, _, _, h, _ in sender.sent] == [b"1", b"2", b"3"]
    assert store.get(fourth).status == "new"
    # another group's failure of the same event has its own budget
    other = dead_letter(store, 5, event_id="same-event", group="chain")
    await store.reinject(other, "alice")


async def test_reinject_cap_also_trusts_the_metadata_count(store: DlqStore) -> None:
    # a runtime that carries avcc-reinjected-count into the failure metadata (see report)
    dlq_id = dead_letter(store, 1, reinjected_count=3)
    with pytest.raises(ReinjectRefused):
        await store.reinject(dlq_id, "alice")


async def test_repeated_reinjection_of_one_entry_is_capped(store: DlqStore) -> None:
    dlq_id = dead_letter(store, 1)
    for _ in range(3):
        await store.reinject(dlq_id, "alice")
    with pytest.raises(ReinjectRefused):
        await store.reinject(dlq_id, "alice")
    assert store.get(dlq_id).reinjected_count == 3


async def test_failed_produce_is_audited_and_keeps_status(store: DlqStore, sender: FakeSender) -> None:
    dlq_id = dead_letter(store, 1)
    sender.fail = True
    with pytest.raises(DlqError, match="broker down"):
        await store.reinject(dlq_id, "alice")
    entry = store.get(dlq_id)
    assert entry.status == "new" and entry.reinjected_count == 0
    assert entry.audit[-1].action == "reinject_failed"


async def test_reinject_without_metadata_is_refused(store: DlqStore) -> None:
    entry, _ = store.index(0, 9, T0, b"k", b"{}", [("avcc-attempt", b"not a number")])
    with pytest.raises(ReinjectRefused, match="original topic unknown"):
        await store.reinject(entry.dlq_id, "alice")


async def test_discard_needs_reason_and_new_status(store: DlqStore) -> None:
    dlq_id = dead_letter(store, 1)
    with pytest.raises(DiscardRefused, match="reason"):
        await store.discard(dlq_id, "bob", "  ")
    await store.discard(dlq_id, "bob", "junk")
    with pytest.raises(DiscardRefused, match="only new"):
        await store.discard(dlq_id, "bob", "again")
    with pytest.raises(DlqNotFound):
        await store.discard("9-9", "bob", "missing")


async def test_list_filters(store: DlqStore) -> None:
    dead_letter(
        store, 1, topic="t.a", group="review", error_class="schemas.errors.SchemaViolation", failed_ms=T0
    )
    dead_letter(store, 2, topic="t.b", group="chain", failed_ms=T0 + 60_000)
    dead_letter(store, 3, topic="t.a", group="chain", failed_ms=T0 + 120_000)
    await store.discard("0-3", "bob", "noise")

    def ids(**kw: Any) -> list[str]:
        return [e.dlq_id for e in store.list(DlqFilter(**kw))]

    assert ids() == ["0-3", "0-2", "0-1"]  # most recent failure first
    assert ids(topic="t.a") == ["0-3", "0-1"]
    assert ids(group="chain") == ["0-3", "0-2"]
    assert ids(error_class="SchemaViolation") == ["0-1"]
    assert ids(error_class="app.platform.errors.DependencyTimeout") == ["0-3", "0-2"]
    assert ids(status="discarded") == ["0-3"]
    assert ids(since_ms=T0 + 1, until_ms=T0 + 60_000) == ["0-2"]
    parsed = DlqFilter.from_mapping(
        {"since": "2026-05-28T20:27", "until": str(T0), "status": "new", "topic": ""}
    )
    assert parsed.until_ms == T0 and parsed.since_ms is not None and parsed.topic is None
    with pytest.raises(ValueError, match="status"):
        DlqFilter.from_mapping({"status": "lost"})
    with pytest.raises(ValueError, match="since"):
        DlqFilter.from_mapping({"since": "yesterday"})


async def test_bulk_reinject_takes_new_matches_only(store: DlqStore, sender: FakeSender) -> None:
    dead_letter(store, 1, topic="t.a")
    dead_letter(store, 2, topic="t.a")
    dead_letter(store, 3, topic="t.b")
    await store.discard("0-2", "bob", "noise")
    result = await store.bulk_reinject(DlqFilter(topic="t.a"), "alice")
    assert result.reinjected == ["0-1"] and result.refused == {}
    assert [s[0] for s in sender.sent] == ["t.a"]


def test_reinject_headers_strip_every_avcc_header() -> None:
    out = reinject_headers([("a", b"1"), ("avcc-error-class", b"x"), ("avcc-target-group", b"g")], "op", 5, 2)
    assert out == [
        ("a", b"1"),
        ("avcc-reinjected-by", b"op"),
        ("avcc-reinjected-at", b"5"),
        ("avcc-reinjected-count", b"2"),
    ]


# -- console over a real aiohttp server ---------------------------------------------------------
