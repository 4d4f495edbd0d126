"""Partners get a fixed 503 while ClickHouse is away; host names, driver text and URL passwords
stay in the operator's log (issue 9)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.platform.errors import ConfigurationError, DependencyTimeout
from app.platform.redaction import redact_url
from app.playback.sink.clickhouse import ClickHouseBackend, DriverBackend, connect
from app.playback.sink.reports import StatsRequest, answer_report
from testing.ports import free_port


async def test_report_answer_hides_the_unreachable_server(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there: a real connection refusal
    backend = DriverBackend("127.0.0.1", port, "avcc", "ops", "hunter2", connect_timeout=1)
    request = StatsRequest.parse({})
    try:
        with caplog.at_level(logging.WARNING, logger="app.playback.sink.reports"):
            response = await answer_report(request.run, backend)
    finally:
        backend.close()
    assert response.status == 503 and response.headers["Retry-After"] == "5"
    assert response.body is not None
    assert orjson.loads(response.body) == {
        "error": "ClickHouse unavailable",
        "reason": "clickhouse_unavailable",
        "retry_after_s": 5,
    }
    logged = caplog.text
    assert f"127.0.0.1:{port}" in logged and "hunter2" not in logged


async def test_report_answer_on_a_timeout_is_the_same_503() -> None:
    def slow(backend: ClickHouseBackend) -> Any:
        raise DependencyTimeout("ClickHouse at clickhouse://ch-internal-7:9000/avcc timed out")

    response = await answer_report(slow, backend=None)  # type: ignore[arg-type]
    assert response.status == 503 and response.body is not None
    assert b"ch-internal" not in response.body


async def test_report_answer_passes_the_body_through() -> None:
    response = await answer_report(lambda backend: {"plays": 3}, backend=None)  # type: ignore[arg-type]
    assert response.status == 200 and response.body == b'{"plays":3}'


@pytest.mark.parametrize(
    "url",
    [
        "clickhouse://ops:hunter2@ch:notaport/avcc",  # bad port
        "clickhouse://ops:hunter2@/avcc",  # no host
        "clickhouse://ops:hunter2@ch:9000/not-an-identifier!",
        "clickhuose://ops:hunter2@ch:9000/avcc",  # unknown scheme
    ],
)
def test_malformed_clickhouse_url_errors_do_not_echo_the_password(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        connect(url, tmp_path)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("clickhouse://ops:hunter2@ch:9000/avcc", "clickhouse://ops:***@ch:9000/avcc"),
        ("clickhouse://ops:p@ss@ch/avcc", "clickhouse://ops:***@ch/avcc"),
        ("clickhouse://:hunter2@ch/avcc", "clickhouse://:***@ch/avcc"),
        ("clickhouse://ops:hunter2@[::1/avcc", "clickhouse://***@[::1/avcc"),  # unparsable host
        ("clickhouse://ops@ch/avcc", "clickhouse://ops@ch/avcc"),
        ("chdb:///var/chdb", "chdb:///var/chdb"),
    ],
)
def test_redact_url_masks_only_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown
