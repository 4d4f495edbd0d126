"""The sink's two read-side reports (playback stats, anomalies) as typed requests.

A request is parsed from the web view's query string (``ValueError`` says which parameter is
wrong, the view answers 400) and run on a ClickHouse connection off the event loop
(:func:`answer_report`). While ClickHouse cannot answer, partners get a fixed 503 body: the
detail (host names, driver messages) goes to the log only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from app.platform.errors import DependencyTimeout, DependencyUnavailable
from app.platform.http.responses import json_error, json_response
from app.playback.sink.clickhouse import ClickHouseBackend
from app.playback.sink.store import list_anomalies, playback_stats
from schemas.types import MAX_EPOCH_MS

__all__ = ["UNAVAILABLE_ERROR", "AnomaliesRequest", "StatsRequest", "answer_report"]

log = logging.getLogger(__name__)

#: The ``error`` of the 503 a partner gets while ClickHouse cannot answer.
UNAVAILABLE_ERROR: Final = "ClickHouse unavailable"

#: Longest text parameter accepted (codes, rules).
_MAX_TEXT: int = 200


def _int_param(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = query.get(name)
    if not text:
        return default
    if not (text.isascii() and text.lstrip("-").isdigit()) or len(text) > 19:
        raise ValueError(f"{name} must be an integer")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}")
    return value


def _text_param(query: Mapping[str, str], name: str) -> str | None:
    text = query.get(name)
    if not text:
        return None
    if len(text) > _MAX_TEXT:
        raise ValueError(f"{name} is too long")
    return str(text)


def _time_range(query: Mapping[str, str]) -> tuple[int, int]:
    """``from_ms`` (default 0) and ``to_ms`` (default: the end of time), epoch ms."""
    from_ms = _int_param(query, "from_ms", 0, 0, MAX_EPOCH_MS)
    return from_ms, _int_param(query, "to_ms", MAX_EPOCH_MS, 0, MAX_EPOCH_MS)


@dataclass(frozen=True, slots=True)
class StatsRequest:
    """``?avcc_code=&from_ms=&to_ms=``: totals of one code (or all) over a time range."""

    avcc_code: str | None
    from_ms: int
    to_ms: int

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> StatsRequest:
        """The request of a query string (``ValueError`` names the bad parameter)."""
        avcc_code = _text_param(query, "avcc_code")
        from_ms, to_ms = _time_range(query)
        return cls(avcc_code, from_ms, to_ms)

    def run(self, backend: ClickHouseBackend) -> dict[str, Any]:
        """The answer body (blocking: call it off the event loop)."""
        return playback_stats(backend, self.avcc_code, self.from_ms, self.to_ms)


@dataclass(frozen=True, slots=True)
class AnomaliesRequest:
    """``?avcc_code=&rule=&from_ms=&to_ms=&limit=``: distinct anomalies, newest window first."""

    avcc_code: str | None
    rule: str | None
    from_ms: int
    to_ms: int
    limit: int

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> AnomaliesRequest:
        """The request of a query string (``ValueError`` names the bad parameter)."""
        avcc_code = _text_param(query, "avcc_code")
        rule = _text_param(query, "rule")
        from_ms, to_ms = _time_range(query)
        return cls(avcc_code, rule, from_ms, to_ms, _int_param(query, "limit", 100, 1, 10_000))

    def run(self, backend: ClickHouseBackend) -> dict[str, Any]:
        """The answer body (blocking: call it off the event loop)."""
        rows = list_anomalies(backend, self.avcc_code, self.rule, self.from_ms, self.to_ms, self.limit)
        return {"anomalies": rows}


async def answer_report(work: Callable[[ClickHouseBackend], Any], backend: ClickHouseBackend) -> web.Response:
    """The JSON answer of ``work`` run on ``backend`` off the event loop; a fixed 503 (retry
    later) while ClickHouse is unreachable or slow, its detail logged."""
    try:
        body = await asyncio.get_running_loop().run_in_executor(None, work, backend)
    except (DependencyUnavailable, DependencyTimeout) as exc:
        log.warning("playback report not answered, ClickHouse unavailable: %s", exc)
        return json_error(503, UNAVAILABLE_ERROR, reason="clickhouse_unavailable", retry_after_s=5)
    return json_response(body)
