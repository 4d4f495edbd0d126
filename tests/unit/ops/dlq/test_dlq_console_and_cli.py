"""DLQ console handlers over a real aiohttp server, and the ``avcc dlq`` CLI calling them."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from aiohttp import ClientSession, web

from app.ops.dlq import cli as dlq_cli
from app.ops.dlq.console import DlqConsole
from app.ops.dlq.reinject import HEADER_REINJECTED_BY
from app.ops.dlq.store import DlqStore
from app.platform.settings import Settings, get_settings
from tests.unit.ops.dlq.conftest import ALICE
from tests.unit.ops.dlq.dead_letters import FakeSender, dead_letter


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


async def test_cli_commands_call_the_console(
    cli_env: None, store: DlqStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dead_letter(store, 1, topic="t.a", event_id="ev-1")
    dead_letter(store, 2, topic="t.a")
    dead_letter(store, 3, topic="t.b")
    assert await asyncio.to_thread(dlq_cli.list_cmd, topic="t.a") == 0
    listed = capsys.readouterr().out.splitlines()[1:-1]  # between the header and the totals
    # by the id column: a random event id can hold "0-3" (CI19: b5e40960-3821-...)
    assert sorted(line.split()[0] for line in listed) == ["0-1", "0-2"]
    assert [line.split()[-1] for line in listed if line.startswith("0-1 ")] == ["ev-1"]
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
