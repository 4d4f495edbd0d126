"""The ops console's lag page in a real headless Chromium: rows, status colours, alert, live updates."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import DLQ
from app.servers import KafkaKRaftBroker, ManagedProcess, free_port
from tests.integration.browser import CHROMIUM_ARGS, chromium, goto_past_refresh, playwright

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


async def test_lag_page_shows_partitions_alert_and_recovers_live(
    kafka_broker: KafkaKRaftBroker, unique: str, tmp_path: Path
) -> None:
    playwright_api = playwright("async_api")
    chromium_path = chromium()
    bootstrap = kafka_broker.bootstrap
    topic, group = f"lagui.apply.{unique}", f"lagui-review-{unique}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=6, replication_factor=1)])[topic].result(timeout=30)
    # Deployed like production: the plan (the DLQ the ops worker indexes) exists before workers.
    apply_plan(Settings(kafka_url=f"kafka://{bootstrap}"), [DLQ])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(1500):
        producer.produce(topic, key=str(i).encode(), value=b"{}")
    assert producer.flush(30) == 0

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AVCC_")}
    env.update(
        AVCC_KAFKA_URL=f"kafka://{bootstrap}",
        AVCC_DATA_DIR=str(tmp_path),
        AVCC_LAG_INTERVAL_S="1",
        AVCC_LAG_GROUP_PREFIX=group,
        AVCC_LAG_RULES=json.dumps(
            [
                {
                    "name": "UiApplyLag",
                    "topic": topic,
                    "groups": [group],
                    "max_lag": 1000,
                    "action": "scale out",
                }
            ]
        ),
        PYTHONPATH=str(ROOT),
        AVCC_OPERATOR_USERS=json.dumps({"lag-ui": "lag-ui-pass"}),
    )
    base = f"http://127.0.0.1:{port}"
    worker = ManagedProcess(
        "ops-worker",
        [str(VENV_BIN / "faust"), "-A", "agents.ops", "worker", "--web-port", str(port), "-l", "info"],
        log_path=tmp_path / "ops-worker.log",
        cwd=tmp_path,
        env=env,
        ready=lambda: _status(f"{base}/ready") == 200,
        ready_timeout=60,
        stop_timeout=30,
        die_with_parent=True,
    )
    worker.start()
    try:
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=chromium_path, args=["--headless", *CHROMIUM_ARGS]
            )
            try:
                page = await browser.new_page(
                    http_credentials={"username": "lag-ui", "password": "lag-ui-pass"}
                )
                rows = page.locator(f"details[data-group='{group}'] table.lag tbody tr")
                deadline = time.monotonic() + 30
                while await rows.count() != 6:
                    assert time.monotonic() < deadline, worker.log_tail()
                    await goto_past_refresh(page, f"{base}/lag")
                    await page.wait_for_timeout(500)
                # Nobody consumes: every partition is lag, the group is STOPped, the alert is shown.
                assert await page.locator("div.alert[data-rule='UiApplyLag']").is_visible()
                for i in range(6):
                    assert await rows.nth(i).get_attribute("data-status") == "STOP"
                badge = rows.first.locator("span.s")
                colour = await badge.evaluate("el => getComputedStyle(el).backgroundColor")
                assert colour == "rgb(130, 80, 223)"  # STOP is purple
                # the partitions are folded under the group rows: read their text, not what is shown
                lags = [int(await rows.nth(i).locator("td").nth(4).text_content() or "") for i in range(6)]
                assert sum(lags) == 1500
                summary = page.locator(f"#groups tr[data-group='{group}']")
                assert await summary.get_attribute("data-status") == "STOP"
                assert int(await summary.locator("td").nth(2).inner_text()) == 1500

                consumer = Consumer(
                    {
                        "bootstrap.servers": bootstrap,
                        "group.id": group,
                        "enable.auto.commit": False,
                        "auto.offset.reset": "earliest",
                    }
                )
                consumer.subscribe([topic])
                got, deadline = 0, time.monotonic() + 60
                while got < 1500 and time.monotonic() < deadline:
                    got += sum(1 for m in consumer.consume(500, 1.0) if m.error() is None)
                consumer.commit(asynchronous=False)
                consumer.close()
                assert got == 1500

                # The page updates itself in place: the alert goes away, rows turn OK.
                await page.wait_for_selector(
                    "div.alert[data-rule='UiApplyLag']", state="detached", timeout=30_000
                )
                await page.wait_for_function(
                    "g => [...document.querySelectorAll(`details[data-group='${g}'] table.lag tbody tr`)]"
                    ".every(r => r.dataset.status === 'OK' && r.cells[4].textContent === '0')",
                    arg=group,
                    timeout=30_000,
                )
            finally:
                await browser.close()
    finally:
        code = worker.stop()
        assert code is not None and code >= 0, worker.log_tail()
