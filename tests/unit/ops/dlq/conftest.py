"""Fixtures of the DLQ unit tests: a recording producer, a store in a temporary directory, the
console over a real aiohttp server and the ``avcc dlq`` CLI environment pointing at it."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from app.ops.dlq.console import DlqConsole, console_application
from app.ops.dlq.store import DlqStore
from app.platform.settings import Settings, get_settings
from tests.unit.ops.dlq.dead_letters import FakeSender


@pytest.fixture
def sender() -> FakeSender:
    return FakeSender()


@pytest.fixture
def store(tmp_path: Path, sender: FakeSender) -> Iterator[DlqStore]:
    with DlqStore(tmp_path / "dlq", sender=sender) as s:
        yield s


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


@pytest.fixture
def cli_env(console: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    port = console.rsplit(":", 1)[1]
    monkeypatch.setenv("AVCC_WEB_HOST", "127.0.0.1")
    monkeypatch.setenv("AVCC_WEB_PORT", port)  # the ops group has port offset 0
    monkeypatch.setenv("AVCC_OPERATOR", "alice:s3cret")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
