"""DLQ store (persistence, audit, re-injection cap), the console handlers and the CLI over HTTP."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from app.ops.dlq import cli as dlq_cli
from app.ops.dlq.console import DlqConsole, console_application
from app.ops.dlq.store import (
    HEADER_REINJECTED_BY,
    HEADER_REINJECTED_COUNT,
    DiscardRefused,
    DlqError,
    DlqFilter,
    DlqNotFound,
    DlqStore,
    ReinjectRefused,
    reinject_headers,
)
from app.platform.kafka.producers import Delivery
from app.platform.settings import Settings, get_settings
from schemas.system import FailureMetadata

T0 = 1_780_000_000_000


class FakeSender:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]], int | None]] = []
        self.fail = False

    async def send(
        self,
        topic: Any,
        value: bytes,
        key: bytes | None = None,
        headers: Any = None,
        partition: int | None = None,
    ) -> Delivery:
        if self.fail:
            raise RuntimeError("broker down")
        self.sent.append((str(topic), value, key, list(headers or []), partition))
        return Delivery(str(topic), partition or 0, len(self.sent) - 1)


def dead_letter(
    store: DlqStore,
    offset: int,
    *,
    partition: int = 0,
    topic: str = "topic.avcc.apply.created",
    group: str = "review",
    error_class: str = "app.platform.errors.DependencyTimeout",
    event_id: str | None = None,
    failed_ms: int = T0,
    value: bytes | None = None,
    key: bytes | None = b"10042",
    extra_headers: list[tuple[str, bytes]] | None = None,
    reinjected_count: int = 0,
) -> str:
    event_id = event_id or str(uuid.uuid4())
    meta = FailureMetadata(
        original_topic=topic,
        original_partition=3,
        original_offset=100 + offset,
        original_timestamp_ms=failed_ms - 5000,
        original_key=key.decode() if key else None,
        consumer_group=group,
        attempt=8,
        first_failure_ms=failed_ms - 4000,
        last_failure_ms=failed_ms,
        error_class=error_class,
        error_message="dependency <b>timed out</b>",
        stacktrace="Traceback (most recent call last):\n  ...\nDependencyTimeout: timed out",
        event_id=event_id,
        reinjected_count=reinjected_count,
    )
    headers = [("trace-id", b"abc"), *(extra_headers or []), *meta.to_headers()]
    body = value if value is not None else orjson.dumps({"event_id": event_id, "payload": {"x": 1}})
    entry, new = store.index(partition, offset, failed_ms + 10, key, body, headers)
    assert new
    return entry.dlq_id


@pytest.fixture
def sender() -> FakeSender:
    return FakeSender()


@pytest.fixture
def store(tmp_path: Path, sender: FakeSender) -> Iterator[DlqStore]:
    with DlqStore(tmp_path / "dlq", sender=sender) as s:
        yield s


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
        store.discard("0-2", "bob", "test data from a load test")
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


def test_discard_needs_reason_and_new_status(store: DlqStore) -> None:
    dlq_id = dead_letter(store, 1)
    with pytest.raises(DiscardRefused, match="reason"):
        store.discard(dlq_id, "bob", "  ")
    store.discard(dlq_id, "bob", "junk")
    with pytest.raises(DiscardRefused, match="only new"):
        store.discard(dlq_id, "bob", "again")
    with pytest.raises(DlqNotFound):
        store.discard("9-9", "bob", "missing")


def test_list_filters(store: DlqStore) -> None:
    dead_letter(
        store, 1, topic="t.a", group="review", error_class="schemas.errors.SchemaViolation", failed_ms=T0
    )
    dead_letter(store, 2, topic="t.b", group="chain", failed_ms=T0 + 60_000)
    dead_letter(store, 3, topic="t.a", group="chain", failed_ms=T0 + 120_000)
    store.discard("0-3", "bob", "noise")

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
    store.discard("0-2", "bob", "noise")
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


@pytest.fixture
async def console(store: DlqStore) -> AsyncIterator[str]:
    settings = Settings(operator_users={"alice": "s3cret", "bob": "hunter2"})
    application = console_application(DlqConsole(settings, store=store))
    server = TestServer(application, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


ALICE = {"Authorization": "Basic " + base64.b64encode(b"alice:s3cret").decode()}


async def test_console_requires_operator_login(console: str, store: DlqStore) -> None:
    dead_letter(store, 1)
    async with ClientSession() as http:
        for path in ("/dlq", "/dlq.json", "/dlq/0-1", "/dlq/0-1.json"):
            async with http.get(console + path) as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"].startswith("Basic realm=")
        bad = {"Authorization": "Basic " + base64.b64encode(b"alice:wrong").decode()}
        async with http.get(console + "/dlq", headers=bad) as r:
            assert r.status == 401
        async with http.post(console + "/dlq/0-1/reinject") as r:
            assert r.status == 401
    assert store.get("0-1").status == "new"


async def test_console_list_and_detail_escape_everything(console: str, store: DlqStore) -> None:
    dead_letter(store, 1, topic="topic.<script>alert(1)</script>", event_id="ev-<i>1</i>")
    async with ClientSession(headers=ALICE) as http:
        async with http.get(console + "/dlq") as r:
            page = await r.text()
            assert r.status == 200 and r.content_type == "text/html"
        assert "<script>alert(1)</script>" not in page
        assert "topic.&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert 'href="/dlq/0-1"' in page
        async with http.get(console + "/dlq/0-1") as r:
            detail = await r.text()
        assert "dependency &lt;b&gt;timed out&lt;/b&gt;" in detail
        assert "DependencyTimeout: timed out" in detail  # stack trace
        assert "trace-id" in detail and "avcc-original-topic" in detail  # headers
        assert "&quot;payload&quot;" in detail  # pretty-printed JSON payload, escaped
        assert 'id="reinject"' in detail and 'action="/dlq/0-1/reinject"' in detail
        async with http.get(console + "/dlq/7-7") as r:
            assert r.status == 404
        async with http.get(console + "/dlq?status=lost") as r:
            assert r.status == 400


async def test_console_reinject_redirects_to_the_new_status(
    console: str, store: DlqStore, sender: FakeSender
) -> None:
    dead_letter(store, 1)
    async with ClientSession(headers=ALICE) as http:
        async with http.post(
            console + "/dlq/0-1/reinject", data={"reason": "bug fixed"}, allow_redirects=False
        ) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/dlq/0-1?done=reinjected"
        async with http.get(console + "/dlq/0-1?done=reinjected") as r:
            page = await r.text()
        assert 'data-status="reinjected"' in page and "Message reinjected." in page
        assert "bug fixed" in page and "alice" in page  # audit trail
    assert len(sender.sent) == 1
    assert dict(sender.sent[0][3])[HEADER_REINJECTED_BY] == b"alice"


async def test_console_refuses_cross_site_posts(console: str, store: DlqStore, sender: FakeSender) -> None:
    dead_letter(store, 1)
    async with ClientSession(headers=ALICE) as http:
        async with http.post(console + "/dlq/0-1/reinject", headers={"Origin": "https://evil.example"}) as r:
            assert r.status == 403
        async with http.post(console + "/dlq/0-1/reinject", headers={"Sec-Fetch-Site": "cross-site"}) as r:
            assert r.status == 403
    assert sender.sent == []


async def test_console_discard_and_bulk_forms(console: str, store: DlqStore, sender: FakeSender) -> None:
    dead_letter(store, 1, topic="t.a")
    dead_letter(store, 2, topic="t.a")
    dead_letter(store, 3, topic="t.b")
    async with ClientSession(headers=ALICE) as http:
        async with http.post(console + "/dlq/0-1/discard", data={"reason": ""}) as r:
            assert r.status == 409
            assert "reason is required" in await r.text()
        async with http.post(
            console + "/dlq/0-1/discard", data={"reason": "junk"}, allow_redirects=False
        ) as r:
            assert r.status == 303
        async with http.post(console + "/dlq/bulk-reinject", data={"topic": "t.a"}) as r:
            assert r.status == 400  # confirmation box not ticked
        async with http.post(console + "/dlq/bulk-reinject", data={"topic": "t.a", "confirm": "yes"}) as r:
            page = await r.text()
            assert r.status == 200 and "Re-injected 1 message(s)" in page
    assert store.get("0-1").status == "discarded"
    assert store.get("0-2").status == "reinjected"
    assert store.get("0-3").status == "new"


async def test_console_json_api(console: str, store: DlqStore) -> None:
    dead_letter(store, 1, topic="t.a", event_id="ev-1")
    dead_letter(store, 2, topic="t.b")
    async with ClientSession(headers={**ALICE, "Accept": "application/json"}) as http:
        async with http.get(console + "/dlq.json", params={"topic": "t.a"}) as r:
            listing = await r.json()
        assert [i["dlq_id"] for i in listing["items"]] == ["0-1"]
        assert listing["counts"]["new"] == 2
        async with http.get(console + "/dlq/0-1.json") as r:
            detail = await r.json()
        assert detail["event_id"] == "ev-1" and detail["payload_kind"] == "json"
        assert detail["stacktrace"].endswith("timed out") and detail["max_reinjections"] == 3
        async with http.post(console + "/dlq/0-1/reinject", json={"operator": "carol"}) as r:
            assert r.status == 200 and (await r.json())["status"] == "reinjected"
        async with http.post(console + "/dlq/0-2/discard", json={"reason": "dup", "operator": "alice"}) as r:
            assert (await r.json())["status"] == "discarded"
        async with http.post(console + "/dlq/bulk-reinject", json={}) as r:
            assert r.status == 400
    assert store.get("0-1").audit[0].who == "carol (via alice)"
    assert store.get("0-2").audit[0].who == "alice"


# -- CLI against the console ---------------------------------------------------------------------


@pytest.fixture
def cli_env(console: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    port = console.rsplit(":", 1)[1]
    monkeypatch.setenv("AVCC_WEB_HOST", "127.0.0.1")
    monkeypatch.setenv("AVCC_WEB_PORT", port)  # the ops group has port offset 0
    monkeypatch.setenv("AVCC_OPERATOR", "alice:s3cret")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


async def test_cli_commands_call_the_console(
    cli_env: None, store: DlqStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dead_letter(store, 1, topic="t.a", event_id="ev-1")
    dead_letter(store, 2, topic="t.a")
    dead_letter(store, 3, topic="t.b")
    assert await asyncio.to_thread(dlq_cli.list_cmd, topic="t.a") == 0
    out = capsys.readouterr().out
    assert "0-1" in out and "0-2" in out and "0-3" not in out and "ev-1" in out
    assert await asyncio.to_thread(dlq_cli.show_cmd, "0-1") == 0
    out = capsys.readouterr().out
    assert "DependencyTimeout: timed out" in out and "trace-id: abc" in out
    assert await asyncio.to_thread(dlq_cli.reinject_cmd, ["0-1"], "dave", None, None) == 0
    assert await asyncio.to_thread(dlq_cli.discard_cmd, "0-2", "dave", "junk") == 0
    assert await asyncio.to_thread(dlq_cli.reinject_cmd, [], "dave", "t.b", None) == 0
    assert await asyncio.to_thread(dlq_cli.reinject_cmd, [], "dave", None, None) == 2
    assert await asyncio.to_thread(dlq_cli.show_cmd, "8-8") == 1
    assert await asyncio.to_thread(dlq_cli.discard_cmd, "0-2", "dave", "again") == 1
    assert [store.get(i).status for i in ("0-1", "0-2", "0-3")] == ["reinjected", "discarded", "reinjected"]
    assert store.get("0-1").audit[0].who == "dave (via alice)"
    monkeypatch.setenv("AVCC_OPERATOR", "alice:wrong")
    assert await asyncio.to_thread(dlq_cli.list_cmd) == 2
    assert "operator login required" in capsys.readouterr().err


def test_cli_without_credentials_outside_dev_mode(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.delenv("AVCC_OPERATOR", raising=False)
    monkeypatch.setenv("AVCC_DEV_MODE", "false")
    get_settings.cache_clear()
    try:
        assert dlq_cli.list_cmd() == 2
    finally:
        get_settings.cache_clear()
    assert "AVCC_OPERATOR" in capsys.readouterr().err


def test_cli_cannot_reach_console(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("AVCC_OPERATOR", "a:b")
    monkeypatch.setenv("AVCC_WEB_PORT", "9")
    get_settings.cache_clear()
    try:
        assert dlq_cli.show_cmd("0-1") == 2
    finally:
        get_settings.cache_clear()
    assert "cannot reach" in capsys.readouterr().err


def test_console_needs_a_store() -> None:
    with pytest.raises(ValueError):
        DlqConsole(Settings())
    web.Application()  # keeps the aiohttp import honest for the fixture above
