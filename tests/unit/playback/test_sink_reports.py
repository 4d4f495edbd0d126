"""The sink's report requests: query-string parsing (what the views answer 400 for)."""

from __future__ import annotations

import pytest

from app.playback.sink.reports import AnomaliesRequest, StatsRequest
from schemas.types import MAX_EPOCH_MS


def test_defaults_cover_every_code_and_all_time() -> None:
    assert StatsRequest.parse({}) == StatsRequest(None, 0, MAX_EPOCH_MS)
    assert AnomaliesRequest.parse({"rule": ""}) == AnomaliesRequest(None, None, 0, MAX_EPOCH_MS, 100)


def test_parameters_are_read() -> None:
    query = {"avcc_code": "MA.1/x", "rule": "user_replay", "from_ms": "5", "to_ms": "9", "limit": "3"}
    assert AnomaliesRequest.parse(query) == AnomaliesRequest("MA.1/x", "user_replay", 5, 9, 3)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"from_ms": "x"}, "from_ms must be an integer"),
        ({"to_ms": "-1"}, f"to_ms must be between 0 and {MAX_EPOCH_MS}"),
        ({"from_ms": "1" * 20}, "from_ms must be an integer"),
        ({"limit": "0"}, "limit must be between 1 and 10000"),
        ({"avcc_code": "x" * 201}, "avcc_code is too long"),
    ],
)
def test_bad_parameters_name_themselves(query: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AnomaliesRequest.parse(query)
