"""The ops console's lag page in a real headless Chromium: rows, status colours, alert, live updates."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from app.platform.kafka.admin import apply_plan
from app.platform.settings import Settings
from app.platform.topics import DLQ
from app.servers import KafkaKRaftBroker
from testing.ports import free_port
from tests.integration.browser import CHROMIUM_ARGS, chromium, goto_past_refresh, in_one_document, playwright
from tests.integration.faust_worker import http_status, worker_process

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


#: What the test reads of the lag page, all at once: the group's partition rows (status, lag),
#: whether the alert is shown, the first STOP badge's colour and the group's summary row.
SNAPSHOT = """
g => {
  const rows = [...document.querySelectorAll(`details[data-group='${g}'] table.lag tbody tr`)];
  const alert = document.querySelector("div.alert[data-rule='UiApplyLag']");
  const badge = rows.length ? rows[0].querySelector('span.s') : null;
  const summary = document.querySelector(`#groups tr[data-group='${g}']`);
  return {
    rows: rows.map(r => [r.dataset.status, r.cells[4].textContent]),
    alert_visible: alert !== null && alert.checkVisibility(),
    colour: badge === null ? null : getComputedStyle(badge).backgroundColor,
    summary_status: summary === null ? null : summary.dataset.status,
    summary_lag: summary === null ? null : summary.cells[2].innerText,
  };
}
"""


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
    worker = worker_process(
        "ops-worker",
        [str(VENV_BIN / "faust"), "-A", "agents.ops", "worker", "--web-port", str(port), "-l", "info"],
        tmp_path,
        env,
        ready=lambda: http_status(f"{base}/ready") == 200,
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
                # Every read of the page in one JS task of one document (it reloads every second).
                snapshot: dict = {"rows": []}
                deadline = time.monotonic() + 60
                while len(snapshot["rows"]) != 6:
                    assert time.monotonic() < deadline, (snapshot, worker.log_tail())
                    await goto_past_refresh(page, f"{base}/lag")
                    snapshot = await in_one_document(page, SNAPSHOT, group)
                    if len(snapshot["rows"]) != 6:
                        await page.wait_for_timeout(500)
                # Nobody consumes: every partition is lag, the group is STOPped, the alert is shown.
                assert snapshot["alert_visible"], snapshot
                assert [status for status, _lag in snapshot["rows"]] == ["STOP"] * 6, snapshot
                assert snapshot["colour"] == "rgb(130, 80, 223)"  # STOP is purple
                # the partitions are folded under the group rows: their text, not what is shown
                assert sum(int(lag) for _status, lag in snapshot["rows"]) == 1500
                assert snapshot["summary_status"] == "STOP"
                assert int(snapshot["summary_lag"]) == 1500

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
