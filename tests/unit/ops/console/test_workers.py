"""The overview's workers section: each worker of the groups with local state as its ``/ready``
answers, a recovering one with how far its restore is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from app.ops.console.pages import Overview, overview_html
from app.ops.console.rates import OffsetHistory
from app.ops.console.settings import ConsoleSettings
from app.ops.console.workers import group_workers, workers_html
from app.platform.groups import group_spec
from app.platform.settings import Settings
from testing.ports import free_port_block

RECOVERING = {
    "group": "code",
    "status": "recovering",
    "reason": "records: recovering 1200 of 400000 changelog records, ETA 3 s",
    "tables": [
        {"table": "claims", "remaining": 0, "total": 0, "records_per_s": 0, "eta_s": None, "standby_lag": 0},
        {"table": "records", "remaining": 1200, "total": 400000, "records_per_s": 400, "eta_s": 3.0},
    ],
}


async def _serve(port: int, status: int, body: dict[str, Any]) -> web.AppRunner:
    async def ready(request: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    application = web.Application()
    application.router.add_get("/ready", ready)
    runner = web.AppRunner(application)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


@pytest.fixture
async def stack_ports() -> AsyncIterator[int]:
    """The base port of a local stack whose code worker recovers and review worker is ready (the
    other groups' workers are not running)."""
    offsets = [group_spec(g).port_offset for g in ("code", "review", "chain", "settlement", "anomaly", "ops")]
    base = free_port_block(offsets)
    runners = [
        await _serve(base + group_spec("code").port_offset, 503, RECOVERING),
        await _serve(base + group_spec("review").port_offset, 200, {"group": "review", "status": "ready"}),
    ]
    yield base
    for runner in runners:
        await runner.cleanup()


async def test_a_recovering_worker_is_shown_as_such_with_its_progress(stack_ports: int) -> None:
    settings = Settings(web_host="127.0.0.1", web_port=stack_ports)
    workers = await group_workers(settings, ConsoleSettings(peer_timeout_s=2.0))
    by_group = {w.group: w for w in workers}
    assert set(by_group) == {"code", "review", "chain", "settlement", "anomaly", "ops"}  # local state only
    assert by_group["code"].recovering and by_group["code"].url == f"http://127.0.0.1:{stack_ports + 1}"
    assert by_group["review"].status == "ready"
    assert by_group["chain"].status == "unreachable"
    page = workers_html(workers)
    assert "Recovering: code</p>" in page
    assert "records: 1,200 of 400,000 records to go, ETA 3 s" in page
    assert '<tr data-group="code" data-status="recovering">' in page
    home = overview_html(Overview(None, OffsetHistory(), None, None, workers=workers), "operator")
    assert "id='workers'" in home and "Recovering: code" in home
