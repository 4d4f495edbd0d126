"""The review workbench with 300 tasks in a real headless Chromium (issue 26).

code, review and ops workers on a real Kafka broker; 300 applications (one bulk request) wait for
a human, 75 of them from one applicant. The reviewer filters by that applicant, sees the title
and content link of every task on each page, oldest first, goes to the second page and decides a
task from it; the console comes back to that page, and the task is decided in the review group.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.ops.console.workbench import PAGE_SIZE
from app.platform.internal_topics import changelog_specs
from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import TOPIC_PLAN
from app.servers import KafkaKRaftBroker
from tests.integration.browser import CHROMIUM_ARGS, chromium, playwright
from tests.integration.stack import API_KEY, Stack, application

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(900)]

OPERATOR, PASSWORD = "operator", "operator-pass"
TASKS = 300
APPLICANT = "applicant-pages"
UNKNOWN_MODEL = {"model_name": "home-made-diffuser", "model_version": "v2.1.0"}
#: What each row of the workbench shows, read in one round trip.
ROW_FIELDS = """rows => rows.map(r => ({
    record: r.dataset.record,
    title: r.querySelector('.title')?.textContent,
    href: r.querySelector('a.content')?.getAttribute('href'),
    link: r.querySelector('a.content')?.textContent,
    hash: r.querySelector('.content-hash')?.textContent,
    applicant: r.querySelector('.applicant')?.textContent,
    model: r.querySelector('.model-name')?.textContent,
    version: r.querySelector('.model-version')?.textContent,
    submitted: r.querySelector('time.submitted')?.getAttribute('datetime'),
    hits: [...r.querySelectorAll('li.hit')].map(h => h.textContent),
}))"""


@pytest.fixture(scope="module")
def workbench_stack(
    module_kafka: KafkaKRaftBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A code, a review and an ops worker; the console signs with the partner key."""
    apply_plan(Settings(kafka_url=f"kafka://{module_kafka.bootstrap}"), [*TOPIC_PLAN, *changelog_specs()])
    stack = Stack(
        module_kafka.bootstrap,
        tmp_path_factory.mktemp("workbench-pages"),
        env={"AVCC_CONSOLE_KEY_ID": API_KEY},
    )
    try:
        stack.start("code", "review")
        stack.env.update(AVCC_CONSOLE_CODE_URL=stack.url("code"), AVCC_CONSOLE_REVIEW_URL=stack.url("review"))
        stack.start("ops")
        yield stack
    finally:
        stack.stop_all()


def _applications() -> list[dict[str, Any]]:
    """300 works waiting for a human: every fourth from :data:`APPLICANT`, each its own title,
    content and hash."""
    works = []
    for i in range(TASKS):
        works.append(
            application(
                ai_tool_info=UNKNOWN_MODEL,
                applicant_id=APPLICANT if i % 4 == 0 else f"applicant-{i % 7}",
                title=f"Work {i}: 日出 over the river",
                content_url=f"s3://aigc-hub-storage/works/pages/{i}.mp4",
                content_hash="sha256:" + hashlib.sha256(f"pages-{time.time_ns()}-{i}".encode()).hexdigest(),
            )
        )
    return works


async def _apply_all(stack: Stack, works: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Record id -> application, through the bulk route (throttled items sent again as they are)."""
    records: dict[int, dict[str, Any]] = {}
    pending = list(works)
    deadline = time.monotonic() + 300
    while pending:
        assert time.monotonic() < deadline, (
            f"{len(pending)} applications never accepted\n{stack.logs(['code'])}"
        )
        status, answer = await stack.call(
            "code",
            "POST",
            "/v1/avcc/applications:batch",
            pending,
            headers={"Content-Type": "application/json"},
        )
        assert status in {202, 429, 503}, answer
        if status != 202 and "items" not in answer:  # busy, or the group still settling
            await asyncio.sleep(1)
            continue
        throttled = []
        for item in answer["items"]:
            work = pending[item["index"]]
            if item["http_status"] == 202:
                records[int(item["avcc_record_id"])] = work
            else:
                assert item["http_status"] == 429, item
                throttled.append(work)
        pending = throttled
    return records


async def _listing(stack: Stack, query: str) -> dict[str, Any]:
    status, body = await stack.call("review", "GET", f"/v1/review/tasks?status=need_human{query}")
    assert status == 200, body
    return dict(body)


async def test_reviewer_filters_pages_and_decides_from_the_second_page(
    workbench_stack: Stack, tmp_path: Path
) -> None:
    api = playwright("async_api")
    executable = chromium()
    stack = workbench_stack
    records = await _apply_all(stack, _applications())
    assert len(records) == TASKS
    deadline = time.monotonic() + 300
    while (await _listing(stack, "&limit=1"))["total"] < TASKS:
        assert time.monotonic() < deadline, f"not every task reached review\n{stack.logs(['review'])}"
        await asyncio.sleep(1)
    mine = await _listing(stack, f"&applicant_id={APPLICANT}")
    expected_order = [t["avcc_record_id"] for t in mine["tasks"]]
    assert len(expected_order) == TASKS // 4 and PAGE_SIZE < TASKS // 4 < 2 * PAGE_SIZE

    async def rows_show_their_work(page: Any) -> list[int]:
        """Record ids of the page's rows, each checked to show its title, content link, hash,
        applicant, AI model and version, submission time and rule hits."""
        rows = await page.eval_on_selector_all("#tasks tbody tr", ROW_FIELDS)
        for row in rows:
            work = records[int(row["record"])]
            assert row["title"] == work["title"], row
            assert row["href"] == row["link"] == work["content_url"], row
            assert row["hash"] == work["content_hash"], row
            assert (row["model"], row["version"]) == (
                UNKNOWN_MODEL["model_name"],
                UNKNOWN_MODEL["model_version"],
            )
            assert row["applicant"] == APPLICANT and row["submitted"], row
            assert "unknown_model" in row["hits"], row
        return [int(row["record"]) for row in rows]

    async def open_page(action: Any, position: str) -> None:
        """Run ``action`` (a navigation) and check the page it loads is at ``position``."""
        async with page.expect_navigation(timeout=60_000):
            await action()
        shown = await page.locator("#position").inner_text()
        assert shown == position, (await page.content())[:3000]

    base = stack.url("ops")
    async with api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, args=["--headless", *CHROMIUM_ARGS])
        try:
            page = await browser.new_page(
                http_credentials={"username": OPERATOR, "password": PASSWORD},
                viewport={"width": 1600, "height": 1200},
            )
            mine_count = TASKS // 4
            await open_page(
                lambda: page.goto(f"{base}/review"), f"Tasks 1 to {PAGE_SIZE} of {TASKS}, oldest first."
            )
            await page.locator("#filters input[name=applicant]").fill(APPLICANT)
            await open_page(
                lambda: page.locator("#filters button[type=submit]").click(),
                f"Tasks 1 to {PAGE_SIZE} of {mine_count}, oldest first.",
            )
            first = await rows_show_their_work(page)
            assert first == expected_order[:PAGE_SIZE]

            await open_page(
                lambda: page.locator("#next-page").click(),
                f"Tasks {PAGE_SIZE + 1} to {mine_count} of {mine_count}, oldest first.",
            )
            second = await rows_show_their_work(page)
            assert second == expected_order[PAGE_SIZE:]
            assert (
                await page.locator("#next-page").count() == 0
                and await page.locator("#first-page").count() == 1
            )
            await page.screenshot(path=str(tmp_path / "workbench-page-2.png"), full_page=True)

            chosen = second[2]
            row = page.locator(f"#tasks tr[data-record='{chosen}']")
            await row.locator("select[name=final_level]").select_option("G")
            await row.locator("input[name=reason]").fill("checked on the second page")
            await row.locator("button[value=approve]").click()
            await page.wait_for_selector("#flash")
            assert await page.locator("#flash").inner_text() == f"approved record {chosen}"
            assert f"applicant={APPLICANT}" in page.url and "after=" in page.url  # back on that page
            assert await page.locator("#position").inner_text() != ""
        finally:
            await browser.close()

    deadline = time.monotonic() + 120
    while True:
        status, body = await stack.call("review", "GET", f"/v1/review/tasks?applicant_id={APPLICANT}")
        assert status == 200, body
        decided = next(t for t in body["tasks"] if t["avcc_record_id"] == chosen)
        if decided["status"] == "done":
            break
        assert time.monotonic() < deadline, decided
        await asyncio.sleep(0.5)
    assert (decided["decision"], decided["reviewer"], decided["decided_by_key"]) == (
        "approved",
        OPERATOR,
        API_KEY,
    )
    assert decided["reason"] == "checked on the second page"
    assert (await _listing(stack, f"&applicant_id={APPLICANT}&limit=1"))["total"] == TASKS // 4 - 1
