"""The DLQ console end to end: a handler fails until "fixed", its message reaches the DLQ, the ops
side indexes it and raises a P2 alert, and an operator re-injects it from a real headless Chromium
(the fixed handler then completes it) and discards another one with a reason."""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

import pytest

from app.ops.dlq import cli as dlq_cli
from app.platform.settings import get_settings
from tests.integration.browser import CHROMIUM_ARGS, chromium, playwright

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(240)]


def _load_faults() -> ModuleType:
    """The worker and broker helpers of ``test_faults.py`` (works with any pytest import mode)."""
    spec = importlib.util.spec_from_file_location(
        "_avcc_faults_helpers", Path(__file__).with_name("test_faults.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


faults = _load_faults()

USER, PASSWORD = "alice", "s3cret"


class AlertReceiver:
    """An Alertmanager stand-in on 127.0.0.1 recording every POSTed alert."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.alerts.extend(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/v2/alerts"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def alert_receiver() -> Iterator[AlertReceiver]:
    receiver = AlertReceiver()
    yield receiver
    receiver.close()


def api(base: str, path: str, *, auth: bool = True) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, headers={"Accept": "application/json"})
    if auth:
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"www-authenticate": exc.headers.get("WWW-Authenticate")}
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, worker: Any) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if worker.proc is not None and worker.proc.poll() is not None:
            raise AssertionError(f"worker exited waiting for {what}:\n{worker.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{worker.log_tail()}")
        time.sleep(0.2)


def test_operator_reinjects_a_fixed_message_and_discards_another_from_the_console(
    broker: Any,
    tmp_path: Path,
    unique: str,
    alert_receiver: AlertReceiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    playwright_api = playwright("sync_api")
    chromium_path = chromium()
    worker = faults.FaultsWorker(
        broker.bootstrap,
        tmp_path / "worker",
        unique,
        console=True,
        env_extra={
            "AVCC_OPERATOR_USERS": json.dumps({USER: PASSWORD}),
            "AVCC_ALERT_WEBHOOK_URL": alert_receiver.url,
            "AVCC_ALERT_DEDUP_WINDOW_S": "300",
            # a short schedule: this test is about the console, test_faults measures the policy
            "AVCC_RETRY_BACKOFF_S": "[0.1, 0.1, 0.1]",
            "AVCC_RETRY_TOPIC_DELAY_S": "1.0",
        },
    )
    faults.plan_topics(broker.bootstrap, (worker.topic, faults.PARTITIONS))
    worker.out.mkdir(parents=True)
    (worker.out / "broken").touch()  # the dependency is broken until the operator fixes it
    # on two partitions, so they fail side by side
    fixed_id, fixed_key, fixed_value = faults.apply_event(faults.record_id_on(0, 7500), "broken-then-fixed")
    junk_id, junk_key, junk_value = faults.apply_event(faults.record_id_on(1, 7500), "always-junk")
    faults.produce(
        broker.bootstrap,
        worker.topic,
        [(fixed_key, fixed_value, [("trace-id", b"t-fixed")], None), (junk_key, junk_value, [], None)],
    )
    worker.start()
    try:
        base = f"http://127.0.0.1:{worker.web_port}"
        listing_path = f"/dlq.json?topic={quote(worker.topic)}"

        def both_indexed() -> list[dict[str, Any]] | None:
            status, body = api(base, listing_path)
            return body["items"] if status == 200 and len(body["items"]) == 2 else None

        items = wait_until(both_indexed, 60, "both dead letters in the console", worker)
        by_event = {item["event_id"]: item for item in items}
        fixed_dlq, junk_dlq = by_event[fixed_id]["dlq_id"], by_event[junk_id]["dlq_id"]
        assert all(i["status"] == "new" and i["consumer_group"] == worker.group for i in items)
        status, body = api(base, listing_path, auth=False)
        assert status == 401 and body["www-authenticate"].startswith("Basic realm=")

        # one P2 alert for the group+error class; the second dead letter was merged into it
        mine = wait_until(
            lambda: [a for a in alert_receiver.alerts if a["labels"].get("group") == worker.group],
            15,
            "the P2 alert",
            worker,
        )
        time.sleep(1.0)
        mine = [a for a in alert_receiver.alerts if a["labels"].get("group") == worker.group]
        assert len(mine) == 1
        assert mine[0]["labels"] == {
            "alertname": "AvccDeadLetter",
            "severity": "P2",
            "group": worker.group,
            "error_class": "app.platform.errors.DependencyTimeout",
        }
        assert mine[0]["annotations"]["topic"] == worker.topic and mine[0]["startsAt"].endswith("Z")

        (worker.out / "broken").unlink()  # the operator fixed the dependency

        with playwright_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(http_credentials={"username": USER, "password": PASSWORD})
                page = context.new_page()
                page.goto(f"{base}/dlq?topic={quote(worker.topic)}")
                assert page.locator("#dlq-table tbody tr").count() == 2
                page.click(f"a.dlq-link:text-is('{fixed_dlq}')")
                page.wait_for_url(f"**/dlq/{fixed_dlq}")
                assert page.locator("#status [data-status]").get_attribute("data-status") == "new"
                assert "DependencyTimeout" in page.locator("#stacktrace").inner_text()
                assert fixed_id in page.locator("#payload").inner_text()
                assert "t-fixed" in page.content()  # original headers are shown
                page.click("#reinject")
                page.wait_for_url(f"**/dlq/{fixed_dlq}?done=reinjected")
                assert page.locator("#status [data-status]").get_attribute("data-status") == "reinjected"
                assert "Message reinjected." in page.locator("#flash").inner_text()
                audit = page.locator("#audit").inner_text()
                assert USER in audit and "reinject" in audit

                page.goto(f"{base}/dlq/{junk_dlq}")
                page.fill("input[name=reason][required]", "test data, never valid")
                page.click("#discard")
                page.wait_for_url(f"**/dlq/{junk_dlq}?done=discarded")
                assert page.locator("#status [data-status]").get_attribute("data-status") == "discarded"
                assert "test data, never valid" in page.locator("#audit").inner_text()
            finally:
                browser.close()

        # the fixed handler completes the re-injected event (same event id), exactly once
        worker.wait_for(lambda: fixed_id in worker.applied_ids(), 30, "re-injected event applied")
        assert worker.applied_ids() == [fixed_id]
        [reinjected] = faults.read_topic(
            broker.bootstrap, worker.topic, lambda r: r.header("avcc-reinjected-by") is not None, expected=1
        )
        assert reinjected.key == fixed_key and reinjected.value == fixed_value
        assert reinjected.header("avcc-reinjected-by") == USER
        assert reinjected.header("avcc-reinjected-count") == "1"
        assert reinjected.header("trace-id") == "t-fixed"
        assert (
            reinjected.header("avcc-target-group") is None and reinjected.header("avcc-error-class") is None
        )

        # the CLI talks to the same worker
        monkeypatch.setenv("AVCC_OPERATOR", f"{USER}:{PASSWORD}")
        monkeypatch.setenv("AVCC_WEB_HOST", "127.0.0.1")
        monkeypatch.setenv("AVCC_WEB_PORT", str(worker.web_port))
        get_settings.cache_clear()
        try:
            assert dlq_cli.show_cmd(fixed_dlq) == 0
            shown = capsys.readouterr().out
            assert "status=reinjected" in shown and f"{USER} reinject" in shown
            assert dlq_cli.list_cmd(topic=worker.topic, status="discarded") == 0
            assert junk_dlq in capsys.readouterr().out
        finally:
            get_settings.cache_clear()
    finally:
        worker.stop()
