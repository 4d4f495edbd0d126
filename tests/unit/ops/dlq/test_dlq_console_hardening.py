"""The DLQ console refuses malformed input with 400 (never 500), sends its security headers, and
``avcc dlq show`` never prints a poisoned dead letter's control characters raw (issue 9)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from app.ops.dlq import cli as dlq_cli
from app.ops.dlq.cli import terminal_safe
from app.ops.dlq.console import DlqConsole, console_application
from app.ops.dlq.store import DlqStore
from app.platform.settings import Settings
from tests.unit.ops.dlq.conftest import ALICE
from tests.unit.ops.dlq.dead_letters import FakeSender, dead_letter

#: Screen clear, a window-title change and an OSC 8 hyperlink, as a poisoned producer would send.
ESCAPES = "\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\"


@pytest.mark.parametrize(
    "body",
    [
        {"operator": 1},
        {"operator": ["alice"]},
        {"reason": {"text": "x"}},
        {"operator": None, "reason": 3.5},
    ],
)
async def test_non_text_json_fields_are_a_400(console: str, store: DlqStore, body: dict[str, Any]) -> None:
    dead_letter(store, 1)
    async with ClientSession(headers=ALICE) as http:
        for path in ("/dlq/0-1/reinject", "/dlq/0-1/discard"):
            async with http.post(console + path, json=body) as r:
                assert r.status == 400, (path, await r.text())
                assert "must be a string" in (await r.json())["error"]
        async with http.post(console + "/dlq/bulk-reinject", json={**body, "topic": "t"}) as r:
            assert r.status == 400
    assert store.get("0-1").status == "new"


async def test_file_upload_in_a_form_is_a_400(console: str, store: DlqStore) -> None:
    dead_letter(store, 1)
    form = aiohttp.FormData()
    form.add_field("operator", b"alice", filename="op.txt", content_type="text/plain")
    async with ClientSession(headers=ALICE) as http, http.post(console + "/dlq/0-1/reinject", data=form) as r:
        assert r.status == 400
    assert store.get("0-1").status == "new"


async def test_console_answers_carry_the_security_headers(console: str, store: DlqStore) -> None:
    dead_letter(store, 1)
    async with ClientSession() as http:
        for headers, path, status in ((ALICE, "/dlq/0-1", 200), ({}, "/dlq", 401), (ALICE, "/dlq/9-9", 404)):
            async with http.get(console + path, headers=headers) as r:
                assert r.status == status
                assert r.headers["X-Frame-Options"] == "DENY"
                assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
                assert r.headers["X-Content-Type-Options"] == "nosniff"


async def test_console_login_takes_utf8_passwords(store: DlqStore) -> None:
    settings = Settings(operator_users={"運維": "密碼-ü"})
    server = TestServer(console_application(DlqConsole(settings, store=store)), host="127.0.0.1")
    await server.start_server()
    token = base64.b64encode("運維:密碼-ü".encode()).decode()
    try:
        async with (
            ClientSession() as http,
            http.get(server.make_url("/dlq.json"), headers={"Authorization": f"Basic {token}"}) as r,
        ):
            assert r.status == 200
    finally:
        await server.close()


def test_terminal_safe_escapes_controls_and_keeps_printable_unicode() -> None:
    assert terminal_safe("a\x1b[31mb\x07\r\n\tc") == "a\\x1b[31mb\\x07\\x0d\\x0a\\x09c"
    assert terminal_safe("line 1\nline 2\tx\r", multiline=True) == "line 1\nline 2\tx\\x0d"
    assert terminal_safe("abc\u202egnp.exe") == "abc\\u202egnp.exe"  # bidi override
    assert terminal_safe("\x9b31m") == "\\x9b31m"  # the 8-bit CSI
    assert terminal_safe("作品 「標題」 émoji 🎵 ā") == "作品 「標題」 émoji 🎵 ā"
    assert terminal_safe(None) == "None" and terminal_safe(42) == "42"


async def test_dlq_show_prints_a_poisoned_dead_letter_escaped(
    cli_env: None, store: DlqStore, sender: FakeSender, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = f'{{"title": "作品 {ESCAPES}", "n": 1}}'.encode()
    dead_letter(
        store,
        1,
        event_id=f"ev{ESCAPES}",
        value=payload,
        extra_headers=[(f"x-{ESCAPES}", ESCAPES.encode())],
    )
    assert await asyncio.to_thread(dlq_cli.show_cmd, "0-1") == 0
    assert await asyncio.to_thread(dlq_cli.list_cmd) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2J" in out and "\\x1b]0;pwned\\x07" in out
    assert "作品" in out  # printable text in any script stays readable


@pytest.mark.parametrize(
    "query", ["since=99999999999999999999999", "until=-99999999999999999999", "since=%C2%B2", "since_ms=1e99"]
)
async def test_out_of_range_times_are_a_400(console: str, store: DlqStore, query: str) -> None:
    dead_letter(store, 1)
    async with ClientSession(headers=ALICE) as http:
        for path in ("/dlq.json", "/dlq"):
            async with http.get(f"{console}{path}?{query}") as r:
                assert r.status == 400, (path, query)
