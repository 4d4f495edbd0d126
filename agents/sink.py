"""Sink group (clickhouse-sink): the faust App that runs the ClickHouse sink and serves its reports.

The sink itself (:mod:`app.playback.sink`) consumes ``topic.playback.event`` and
``topic.playback.anomaly`` with its own confluent-kafka consumer in a dedicated thread
(:class:`~app.playback.sink.loop.SinkLoop`, see its docstring for the guarantees); this module
wires it into a worker: a :class:`~app.playback.sink.runner.SinkRunner` is the group's own
consumer (:mod:`app.platform.faust.own_consumer`), and two HMAC-signed views answer from
ClickHouse.

Run: ``faust -A agents.sink worker -l info --web-port 6072`` (or ``avcc worker sink``). Views:
``GET /v1/playback/stats?avcc_code=&from_ms=&to_ms=`` and
``GET /v1/playback/anomalies?avcc_code=&rule=&from_ms=&to_ms=&limit=`` (HMAC-signed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import faust
from aiohttp import web

from app.api import ANOMALIES, STATS
from app.platform.faust.app import get_app
from app.platform.faust.own_consumer import own_consumer
from app.platform.http.auth import require_hmac
from app.platform.http.openapi import route
from app.platform.http.responses import json_error
from app.platform.settings import get_settings
from app.playback.sink.batch import GROUP
from app.playback.sink.clickhouse import ClickHouseBackend
from app.playback.sink.reports import AnomaliesRequest, StatsRequest, answer_report
from app.playback.sink.runner import SinkRunner

__all__ = [
    "GROUP",
    "PlaybackAnomaliesView",
    "PlaybackStatsView",
    "app",
    "sink",
]


app: faust.App = get_app(GROUP)
# The sink consumes with its own confluent-kafka consumer; faust's consumer and producer would
# only join the group pointlessly (and an App without topics cannot subscribe at all).
app.boot_strategy = app.BootStrategy(app, enable_kafka=False)


class Report(Protocol):
    """A report request the sink answers from ClickHouse."""

    def run(self, backend: ClickHouseBackend) -> Any: ...


#: The sink, run for the life of the worker; its crash stops the worker.
sink, common = own_consumer(app, GROUP, lambda: SinkRunner(get_settings()), stop_timeout_s=35.0)


async def _answer(request: web.Request, parse: Callable[[Mapping[str, str]], Report]) -> web.Response:
    """The report the query asks for (``parse`` reads it; 400 naming the parameter), run off the
    event loop; 503 (retry later) while the sink or ClickHouse is unavailable."""
    try:
        wanted = parse(request.query)
    except ValueError as exc:
        return json_error(400, str(exc), reason="bad_parameter")
    runner = sink.running
    if runner is None:
        return json_error(503, "the sink is not running", reason="unavailable", retry_after_s=1)
    return await answer_report(wanted.run, runner.query_backend)


@route(app, STATS)
class PlaybackStatsView(faust.web.View):
    """``GET /v1/playback/stats``: exact play/complete/purchase counts, revenue, unique users."""

    @require_hmac("playback:read")
    async def get(self, request: web.Request) -> web.Response:
        return await _answer(request, StatsRequest.parse)


@route(app, ANOMALIES)
class PlaybackAnomaliesView(faust.web.View):
    """``GET /v1/playback/anomalies``: distinct anomalies, newest window first."""

    @require_hmac("playback:read")
    async def get(self, request: web.Request) -> web.Response:
        return await _answer(request, AnomaliesRequest.parse)
