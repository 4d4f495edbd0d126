"""Alerts: Alertmanager body shape, webhook failures never raise, de-duplication window."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from app.ops.alerts import (
    DEAD_LETTER_ALERT,
    Alert,
    AlertDispatcher,
    LogAlertSink,
    WebhookAlertSink,
    dead_letter_alert,
    default_sinks,
)
from app.platform.settings import Settings


class RecordingSink:
    def __init__(self) -> None:
        self.batches: list[list[Alert]] = []

    async def send(self, alerts: Sequence[Alert]) -> None:
        self.batches.append(list(alerts))

    async def close(self) -> None:
        pass


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def alert(
    group: str = "review", error_class: str = "app.platform.errors.DependencyTimeout", **extra: Any
) -> Alert:
    return dead_letter_alert(
        group=group,
        error_class=error_class,
        topic="topic.avcc.apply.created",
        dlq_id="0-1",
        error_message="timed out",
        **extra,
    )


class Webhook:
    """A real aiohttp server on 127.0.0.1 recording what it receives."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.content_types: list[str] = []
        self.status = 200
        self.delay_s = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        self.content_types.append(request.content_type)
        self.bodies.append(orjson.loads(await request.read()))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return web.Response(status=self.status, text="ok")


@pytest.fixture
async def webhook() -> AsyncIterator[tuple[Webhook, str]]:
    hook = Webhook()
    application = web.Application()
    application.router.add_post("/api/v2/alerts", hook.handle)
    server = TestServer(application, host="127.0.0.1")
    await server.start_server()
    try:
        yield hook, str(server.make_url("/api/v2/alerts"))
    finally:
        await server.close()


async def test_webhook_posts_an_alertmanager_array(webhook: tuple[Webhook, str]) -> None:
    hook, url = webhook
    sink = WebhookAlertSink(url, timeout_s=2)
    start = datetime(2026, 6, 2, 10, 30, tzinfo=UTC)
    resolved = Alert(
        labels={"alertname": "AvccConsumerLag", "severity": "P2", "group": "review"},
        annotations={"summary": "lag"},
        starts_at=start,
        ends_at=start + timedelta(minutes=5),
    )
    try:
        await sink.send([alert(event_id="e-1", console_url="http://ops:6066/"), resolved])
    finally:
        await sink.close()
    assert hook.content_types == ["application/json"]
    [body] = hook.bodies
    assert isinstance(body, list) and len(body) == 2
    first, second = body
    assert first["labels"] == {
        "alertname": DEAD_LETTER_ALERT,
        "severity": "P2",
        "group": "review",
        "error_class": "app.platform.errors.DependencyTimeout",
    }
    assert first["annotations"]["event_id"] == "e-1"
    assert first["annotations"]["dlq_id"] == "0-1"
    assert "summary" in first["annotations"] and "description" in first["annotations"]
    assert first["generatorURL"] == "http://ops:6066/dlq/0-1"
    assert first["startsAt"].endswith("Z")
    datetime.fromisoformat(first["startsAt"].replace("Z", "+00:00"))
    assert "endsAt" not in first
    assert second["startsAt"] == "2026-06-02T10:30:00.000Z"
    assert second["endsAt"] == "2026-06-02T10:35:00.000Z"
    assert all(isinstance(v, str) for a in body for v in (*a["labels"].values(), *a["annotations"].values()))


@pytest.mark.parametrize(
    ("status", "delay_s", "timeout_s", "logged"),
    [(500, 0.0, 2.0, "answered 500"), (200, 1.0, 0.2, "TimeoutError")],
    ids=["error-status", "timeout"],
)
async def test_webhook_failure_is_logged_not_raised(
    webhook: tuple[Webhook, str],
    caplog: pytest.LogCaptureFixture,
    status: int,
    delay_s: float,
    timeout_s: float,
    logged: str,
) -> None:
    hook, url = webhook
    hook.status, hook.delay_s = status, delay_s
    sink = WebhookAlertSink(url, timeout_s=timeout_s)
    with caplog.at_level(logging.ERROR, logger="app.ops.alerts"):
        await sink.send([alert()])
    await sink.close()
    assert sink.failures == 1
    assert logged in caplog.text


async def test_webhook_unreachable_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    sink = WebhookAlertSink("http://127.0.0.1:9/api/v2/alerts", timeout_s=1)  # discard port: refused
    with caplog.at_level(logging.ERROR, logger="app.ops.alerts"):
        await sink.send([alert()])
    await sink.close()
    assert sink.failures == 1
    assert "failed" in caplog.text


async def test_log_sink_writes_one_structured_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="avcc.alerts"):
        await LogAlertSink().send([alert()])
    [record] = caplog.records
    assert "ALERT AvccDeadLetter" in record.getMessage()
    assert '"error_class":"app.platform.errors.DependencyTimeout"' in record.getMessage()


async def test_dedup_merges_same_group_and_error_within_window() -> None:
    sink, clock = RecordingSink(), FakeClock()
    dispatcher = AlertDispatcher([sink], window_s=300, clock=clock)
    assert await dispatcher.dispatch(alert())
    clock.now += 10
    assert not await dispatcher.dispatch(alert())
    clock.now += 100
    assert not await dispatcher.dispatch(alert())
    assert dispatcher.suppressed(alert()) == 2
    # another error class or another group is a different alert
    assert await dispatcher.dispatch(alert(error_class="schemas.errors.SchemaViolation"))
    assert await dispatcher.dispatch(alert(group="chain"))
    assert len(sink.batches) == 3
    # after the window the next one goes out, carrying the suppressed count
    clock.now += 300
    assert await dispatcher.dispatch(alert())
    last = sink.batches[-1][0]
    assert last.annotations["suppressed_count"] == "2"
    assert dispatcher.suppressed(alert()) == 0
    # the window restarts from that send
    clock.now += 1
    assert not await dispatcher.dispatch(alert())


async def test_dedup_key_is_configurable_for_other_alerts() -> None:
    sink, clock = RecordingSink(), FakeClock()
    dispatcher = AlertDispatcher([sink], window_s=60, key_labels=("alertname", "group", "topic"), clock=clock)
    lag = Alert(labels={"alertname": "AvccConsumerLag", "group": "review", "topic": "a"})
    assert await dispatcher.dispatch(lag)
    assert not await dispatcher.dispatch(Alert(labels={**lag.labels}))
    assert await dispatcher.dispatch(Alert(labels={**lag.labels, "topic": "b"}))


async def test_a_failing_sink_does_not_stop_the_others() -> None:
    class Broken:
        async def send(self, alerts: Sequence[Alert]) -> None:
            raise RuntimeError("boom")

        async def close(self) -> None:
            raise RuntimeError("boom")

    good = RecordingSink()
    dispatcher = AlertDispatcher([Broken(), good], window_s=1)
    assert await dispatcher.dispatch(alert())
    assert len(good.batches) == 1
    await dispatcher.close()


def test_default_sinks_follow_settings() -> None:
    assert [type(s) for s in default_sinks(Settings())] == [LogAlertSink]
    with_hook = default_sinks(Settings(alert_webhook_url="http://am:9093/api/v2/alerts"))
    assert [type(s) for s in with_hook] == [LogAlertSink, WebhookAlertSink]
