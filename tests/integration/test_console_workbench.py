"""The console home page and the human review workbench in a real headless Chromium.

code, review, chain and settlement workers plus the ops worker run on a real Kafka broker. An
application lands in ``need_human``; the overview shows it among the records by status; an
operator approves it from the workbench page; its AVCC code is issued, and the review task
names the operator as reviewer and the console's key as ``decided_by_key``. Cross-site and
token-less POSTs are refused and change nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import TOPIC_PLAN
from tests.integration.browser import CHROMIUM_ARGS, chromium, goto_past_refresh, playwright
from tests.integration.stack import CONSOLE_KEY, CORE_GROUPS, Stack, application, console_env, record_when

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(400)]

OPERATOR, PASSWORD = "reviewer-ann", "reviewer-ann-pass"
UNKNOWN_MODEL = {"model_name": "home-made-diffuser", "model_version": "v2.1.0"}


@pytest.fixture(scope="module")
def console_stack(module_kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The core groups and the ops worker, the console signing with its own scoped key."""
    root = tmp_path_factory.mktemp("console-stack")
    apply_plan(Settings(kafka_url=f"kafka://{module_kafka.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    stack = Stack(
        module_kafka.bootstrap, root, env={**console_env(OPERATOR, PASSWORD), "AVCC_LAG_INTERVAL_S": "1"}
    )
    try:
        stack.start(*CORE_GROUPS)
        stack.env.update(
            AVCC_CONSOLE_REVIEW_URL=stack.url("review"),
            AVCC_CONSOLE_CODE_URL=stack.url("code"),
        )
        stack.start("ops")
        yield stack
    finally:
        stack.stop_all()


async def _need_human(stack: Stack) -> int:
    status, answer = await stack.call(
        "code", "POST", "/v1/avcc/applications", application(ai_tool_info=UNKNOWN_MODEL)
    )
    assert status == 202, answer
    record_id = int(answer["avcc_record_id"])
    await record_when(stack, record_id, lambda r: r["status"] == "need_human")
    return record_id


async def _task(stack: Stack, record_id: int) -> dict[str, Any]:
    status, listing = await stack.call("review", "GET", "/v1/review/tasks")
    assert status == 200, listing
    return next(t for t in listing["tasks"] if t["avcc_record_id"] == record_id)


async def test_overview_and_workbench_decide_a_need_human_application(
    console_stack: Stack, tmp_path: Path
) -> None:
    api = playwright("async_api")
    executable = chromium()
    approved, untouched = await _need_human(console_stack), await _need_human(console_stack)
    base = console_stack.url("ops")
    async with api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, args=["--headless", *CHROMIUM_ARGS])
        try:
            page = await browser.new_page(
                http_credentials={"username": OPERATOR, "password": PASSWORD},
                viewport={"width": 1400, "height": 1000},
            )
            # Home: groups with status and trend charts (after a few lag snapshots), records by status.
            await page.goto(f"{base}/")
            for _ in range(60):
                groups = await page.locator("#groups tbody tr").count()
                points = await page.locator("#groups polyline").count()
                if groups >= 4 and points >= 4:
                    break
                await page.wait_for_timeout(1000)
                await page.goto(f"{base}/")
            assert await page.title() == "Pipeline overview · AVCC console"
            assert await page.locator("#groups tr[data-group='avcc-review']").count() == 1
            assert await page.locator("#groups polyline").count() >= 4, await page.content()
            assert await page.locator("#topics tbody tr").count() > 0
            need_human = page.locator("#records tr[data-status='need_human'] td.n")
            assert int(await need_human.inner_text()) >= 2
            assert await page.locator("#dlq tr[data-status='new']").count() == 1
            await page.screenshot(path=str(tmp_path / "console-home.png"), full_page=True)
            shutil.copy(tmp_path / "console-home.png", "/tmp/console-home.png")

            # Lag page: one row per group, its partitions folded in the row.
            await page.goto(f"{base}/lag")
            assert await page.locator("meta[http-equiv='refresh']").count() == 0
            assert await page.locator("#groups tr[data-group='avcc-code']").count() == 1
            partitions = page.locator("details[data-group='avcc-code']")
            assert not await partitions.locator("table.lag").is_visible()
            await partitions.locator("summary").click()
            assert await partitions.locator("table.lag").is_visible()

            # Workbench: the evidence is shown; approve one task from its form.
            await goto_past_refresh(page, f"{base}/review")
            row = page.locator(f"#tasks tr[data-record='{approved}']")
            task = await _task(console_stack, approved)
            assert task["report_hash"] in await row.inner_text()
            assert await page.locator(f"#tasks tr[data-record='{untouched}']").count() == 1
            await row.locator("select[name=final_level]").select_option("G")
            await row.locator("input[name=reason]").fill("provenance checked by hand")
            await row.locator("button[value=approve]").click()
            await page.wait_for_selector("#flash")
            assert await page.locator("#flash").inner_text() == f"approved record {approved}"
            await page.screenshot(path=str(tmp_path / "console-review.png"), full_page=True)
        finally:
            await browser.close()

    issued = await record_when(console_stack, approved, lambda r: r.get("avcc_code"))
    assert issued["status"] == "issued" and issued["final_level"] == "G"
    decided = await _task(console_stack, approved)
    assert decided["reviewer"] == OPERATOR and decided["decided_by_key"] == CONSOLE_KEY
    assert decided["reason"] == "provenance checked by hand"

    # A cross-site POST (even with the login) and a same-site POST without a form token are refused.
    login = {"Authorization": aiohttp.encode_basic_auth(OPERATOR, PASSWORD)}
    form = {"decision": "approve", "final_level": "G", "reason": "forged"}
    url = f"{base}/review/{untouched}/decision"
    async with aiohttp.ClientSession(headers=login) as session:
        async with session.post(
            url, data=form, headers={"Origin": "http://evil.example"}, allow_redirects=False
        ) as response:
            assert response.status == 403
        async with session.post(url, data=form, headers={"Origin": base}, allow_redirects=False) as response:
            assert response.status == 403
            assert "form expired or not from this console" in await response.text()
        async with session.post(
            url, data={**form, "form_token": "1.deadbeef"}, allow_redirects=False
        ) as response:
            assert response.status == 403
    assert (await _task(console_stack, untouched))["status"] == "need_human"
