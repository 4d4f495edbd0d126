"""The live lag page in a real headless Chromium (issue 26): inside the console, updated in place.

An ops worker (lag snapshots every second) watches a group that consumes nothing from a 6-partition
topic. The operator unfolds the group's row; more messages are produced; after at least two
updates the row is still unfolded, its partitions show the newer end offsets, and the page was
never reloaded (a marker set in the page survives). The page wears the console's navigation and
styling, and its CSP allows the worker's own script and nothing inline.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import DLQ
from app.servers import KafkaKRaftBroker
from testing.ports import free_port
from tests.integration.browser import CHROMIUM_ARGS, chromium, playwright
from tests.integration.faust_worker import http_status, worker_process

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
LOGIN = ("lag-live", "lag-live-pass")
INTERVAL_S = 1.0
FIRST, MORE = 1200, 600


def _produce(bootstrap: str, topic: str, count: int, start: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(start, start + count):
        producer.produce(topic, key=str(i).encode(), value=b"{}")
    assert producer.flush(30) == 0


async def test_unfolded_row_stays_unfolded_while_numbers_update_in_place(
    kafka_broker: KafkaKRaftBroker, unique: str, tmp_path: Path
) -> None:
    api = playwright("async_api")
    executable = chromium()
    bootstrap = kafka_broker.bootstrap
    topic, group = f"laglive.apply.{unique}", f"laglive-review-{unique}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=6, replication_factor=1)])[topic].result(timeout=30)
    apply_plan(Settings(kafka_url=f"kafka://{bootstrap}"), [DLQ])
    _produce(bootstrap, topic, FIRST, 0)

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
    env.update(
        AVCC_KAFKA_URL=f"kafka://{bootstrap}",
        AVCC_DATA_DIR=str(tmp_path),
        AVCC_LAG_INTERVAL_S=str(INTERVAL_S),
        AVCC_LAG_GROUP_PREFIX=group,
        AVCC_LAG_RULES=json.dumps(
            [{"name": "LiveLag", "topic": topic, "groups": [group], "max_lag": 100_000, "action": "none"}]
        ),
        AVCC_OPERATOR_USERS=json.dumps(dict([LOGIN])),
        PYTHONPATH=str(ROOT),
    )
    base = f"http://127.0.0.1:{port}"
    worker = worker_process(
        "ops-worker",
        [sys.executable, "-m", "app", "worker", "ops", "--web-port", str(port)],
        tmp_path,
        env,
        ready=lambda: http_status(f"{base}/ready") == 200,
        ready_timeout=120,
    )
    worker.start()
    try:
        async with api.async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=executable, args=["--headless", *CHROMIUM_ARGS]
            )
            try:
                page = await browser.new_page(http_credentials={"username": LOGIN[0], "password": LOGIN[1]})
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                response = await page.goto(f"{base}/lag")
                assert response is not None and response.status == 200
                policy = await response.header_value("content-security-policy")
                assert (
                    policy is not None
                    and "script-src 'self'" in policy
                    and "frame-ancestors 'none'" in policy
                )
                assert await page.locator("header nav a[href='/review']").count() == 1  # the console's bar
                assert await page.title() == "Consumer lag · AVCC console"

                folded = page.locator(f"details[data-group='{group}']")
                await folded.wait_for(state="attached", timeout=60_000)  # the first snapshot, live
                ends = folded.locator("table.lag tbody tr td:nth-child(3)")
                await page.wait_for_function(
                    "([g, n]) => [...document.querySelectorAll(`details[data-group='${g}'] tbody tr`)]"
                    ".reduce((s, r) => s + Number(r.cells[2].textContent), 0) === n",
                    arg=[group, FIRST],
                    timeout=30_000,
                )
                await page.evaluate("() => { window.avccNotReloaded = true; }")
                await folded.locator("summary").click()
                assert await folded.get_attribute("open") is not None and await ends.first.is_visible()
                updates = int(await page.locator("#live").get_attribute("data-updates") or "0")
                taken = await page.locator("#taken-at").get_attribute("datetime")

                _produce(bootstrap, topic, MORE, FIRST)
                await page.wait_for_function(
                    "([g, n, u]) => Number(document.getElementById('live').dataset.updates || 0) >= u + 2"
                    " && [...document.querySelectorAll(`details[data-group='${g}'] tbody tr`)]"
                    ".reduce((s, r) => s + Number(r.cells[2].textContent), 0) === n",
                    arg=[group, FIRST + MORE, updates],
                    timeout=60_000,
                )
                assert await page.evaluate("() => window.avccNotReloaded === true")  # never reloaded
                assert await folded.get_attribute("open") is not None  # still unfolded
                assert await ends.first.is_visible()
                assert await page.locator("#taken-at").get_attribute("datetime") != taken  # newer numbers
                shown = [int(await ends.nth(i).text_content() or "0") for i in range(await ends.count())]
                assert sum(shown) == FIRST + MORE
                assert errors == [], errors  # the CSP let the script run: no violation reported
                await page.screenshot(path=str(tmp_path / "lag-live.png"), full_page=True)
            finally:
                await browser.close()
    finally:
        code = worker.stop()
        assert code is not None and code >= 0, worker.log_tail()
