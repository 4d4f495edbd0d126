"""Console building blocks: form tokens, SVG charts, offset-history rates, the pages' HTML."""

from __future__ import annotations

import pytest

from app.api import TASKS
from app.ops.console.charts import sparkline
from app.ops.console.csrf import FormTokens
from app.ops.console.pages import Overview, overview_html
from app.ops.console.rates import OffsetHistory, rate_series
from app.ops.console.settings import ConsoleSettings
from app.ops.console.workbench import PAGE_SIZE, WorkbenchQuery, workbench_html
from app.platform.lag.snapshot import LagSnapshot, PartitionOffsets
from app.platform.metrics import TIME_TO_CODE_BUCKETS
from app.platform.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_form_token_is_bound_to_operator_and_expires() -> None:
    clock = Clock()
    tokens = FormTokens(b"k" * 32, ttl_s=60, clock=clock)
    token = tokens.issue("alice")
    assert tokens.valid("alice", token)
    assert not tokens.valid("mallory", token)
    assert not tokens.valid("alice", None)
    assert not tokens.valid("alice", "garbage")
    stamp, mac = token.split(".")
    assert not tokens.valid("alice", f"{int(stamp) + 1}.{mac}")
    assert not FormTokens(b"x" * 32, ttl_s=60, clock=clock).valid("alice", token)
    clock.now += 61
    assert not tokens.valid("alice", token)


def test_sparkline_scales_points_and_escapes_label() -> None:
    svg = sparkline([(0, 0), (10, 5), (20, 10)], width=100, height=20, label="<t>")
    assert svg.startswith("<svg") and "<polyline" in svg
    assert "0.0,18.0" in svg and "100.0,2.0" in svg
    assert "&lt;t&gt;" in svg and "<t>" not in svg
    assert "no data yet" in sparkline([(0, 1)], label="x")


def _snapshot(at: float, end: int, committed: int) -> LagSnapshot:
    parts = tuple(PartitionOffsets("g", "t", p, end, committed) for p in range(2))
    return LagSnapshot(at, parts)


def test_history_gives_produce_and_consume_rates_and_lag_trend() -> None:
    history = OffsetHistory(horizon_s=100)
    assert history.rate(history.topic_ends.get("t")) is None
    history.add(_snapshot(0, 100, 0))
    history.add(_snapshot(10, 200, 50))
    history.add(_snapshot(20, 300, 300))
    assert history.rate(history.topic_ends["t"]) == 20.0  # 2 partitions x 100 per 10 s
    assert history.rate(history.group_commits["g"]) == 30.0
    assert [v for _, v in history.group_lags["g"]] == [200.0, 300.0, 0.0]
    assert rate_series(history.topic_ends["t"]) == [(10, 20.0), (20, 20.0)]
    history.add(_snapshot(200, 300, 300))
    assert len(history.topic_ends["t"]) == 1  # older than the horizon: dropped


def test_overview_shows_every_record_status_and_unavailable_parts() -> None:
    overview = Overview(None, OffsetHistory(), {"new": 2}, None, errors={"code": "down <b>"})
    text = overview_html(overview, "alice")
    assert "id='records-error'" in text and "down &lt;b&gt;" in text
    assert '<tr data-status="new">' in text and "id='no-snapshot'" in text
    overview = Overview(None, OffsetHistory(), None, {"issued": 3, "weird": 1})
    text = overview_html(overview, "alice")
    for status in ("submitted", "need_human", "approved", "issued", "rejected", "chain_failed", "weird"):
        assert f'<tr data-status="{status}">' in text


def test_overview_names_a_silent_code_replica_with_its_partitions() -> None:
    replicas = [
        {"url": "http://127.0.0.1:6067", "partitions": [0, 2], "answered": True, "counts": {"issued": 4}},
        {"url": "http://127.0.0.2:6067", "partitions": [1, 3, 5], "answered": False, "error": "answered 503"},
    ]
    overview = Overview(
        None, OffsetHistory(), {}, {"issued": 4}, record_replicas=replicas, missing_partitions=[1, 3, 4, 5]
    )
    text = overview_html(overview, "alice")
    assert (
        "<p class='flash error replica-missing' data-replica='http://127.0.0.2:6067' "
        "data-partitions='1, 3, 5'>code replica http://127.0.0.2:6067 did not answer (answered 503): "
        "the records of its partitions 1, 3, 5 are not counted</p>"
    ) in text
    assert "id='records-unowned' data-partitions='4'" in text  # no owner: not the silent replica's
    assert "Counted by http://127.0.0.1:6067 (0, 2)." in text
    assert "<tr data-status=\"issued\"><td>issued</td><td class='n'>4</td></tr>" in text


def test_overview_shows_time_to_code_per_level_and_the_oldest_wait_for_a_person() -> None:
    bounds = list(TIME_TO_CODE_BUCKETS)
    late = [0] * bounds.index(90.0) + [1] * (len(bounds) - bounds.index(90.0) + 1)  # 61-90 s
    times = {
        "bounds": bounds,
        "series": [
            {"level": "O", "outcome": "issued", "review": "ai", "buckets": [0, 0, 3, *[4] * 22], "sum": 1.2},
            {"level": "G", "outcome": "issued", "review": "ai", "buckets": late, "sum": 7.0},
        ],
        "stages": [{"level": "G", "stage": "chain", "count": 1, "sum": 6.5}],
        "oldest_need_human_ms": 1_000_000,
        "missing_partitions": [5],
    }
    now_ms = 1_000_000 + 2 * 3600 * 1000  # the oldest has waited 2 h, past the hour allowed
    overview = Overview(None, OffsetHistory(), {}, {"need_human": 3}, time_to_code=times, now_ms=now_ms)
    text = overview_html(overview, "alice")
    o_row = "<tr data-level='O' data-answered='4' data-in-time='4' data-p50-s='0.26666666666666666'"
    assert o_row + " data-p99-s='0.396' data-compliance='1.0' data-budget-left='1.0'>" in text
    assert (
        "<td>O</td><td>99 % within 5 s</td><td>4</td><td>0.27 s</td><td>0.40 s</td><td>100.0 %</td>" in text
    )
    g_row = text[text.index("<tr data-level='G'") :].split("</tr>")[0]
    assert "data-in-time='0' data-p50-s='75.0'" in g_row and "<td>0.0 %</td>" in g_row
    assert "data-budget-left='-99.0'" in g_row and "<td class='error'>-9900.0 %</td>" in g_row
    assert "<td>chain (mean 6.50 s)</td>" in g_row
    assert "<tr data-level='P' data-answered='0' data-in-time='0'>" in text  # nothing answered: no figures
    wait = text[text.index("<p id='human-wait'") :].split("</p>")[0]
    assert "class='flash error' data-since-ms='1000000'" in wait
    assert "3 works wait for a person; the oldest has waited <b>2 h 0 min</b>" in wait
    assert "<a href='/review'>review workbench</a>" in wait
    assert "id='waits-unknown'" in text
    calm = overview_html(
        Overview(None, OffsetHistory(), {}, {}, time_to_code={**times, "oldest_need_human_ms": None}), "a"
    )
    assert "No work waits for a person" in calm
    assert "Time to code, last hour</h2><p class='flash error'>unavailable" in overview_html(
        Overview(None, OffsetHistory(), {}, {}), "a"
    )


def test_workbench_forms_carry_token_and_escape_evidence() -> None:
    task = {
        "avcc_record_id": 7,
        "applicant_id": "<a>",
        "overall_score": 0.61,
        "final_level": "G",
        "report_hash": "sha256:ab",
        "report": {"rule_hits": ["<script>"]},
        "created_ms": 1_717_312_200_000,
    }
    listing = {"tasks": [task], "count": 1, "total": 1, "remaining": 1, "next": None}
    text = workbench_html(listing, "123.abc", "alice")
    assert 'action="/review/7/decision"' in text and 'value="123.abc"' in text
    assert "<script>" not in text and "&lt;a&gt;" in text and "sha256:ab" in text
    assert "<span class='title muted'>—</span>" in text  # a task from before titles were kept
    empty = {"tasks": [], "count": 0, "total": 0, "remaining": 0, "next": None}
    assert "id='no-tasks'" in workbench_html(empty, "t", "alice")


def test_workbench_row_shows_the_work_the_tool_and_the_rule_hits() -> None:
    task = {
        "avcc_record_id": 42,
        "title": "Sunrise <over> the river",
        "content_url": "https://cdn.example.com/works/42.mp4",
        "content_hash": "sha256:" + "c" * 64,
        "applicant_id": "applicant-7",
        "ai_tool_info": {"model_name": "home-made-diffuser", "model_version": "v2.1.0"},
        "overall_score": 61.5,
        "final_level": "P",
        "report_hash": "sha256:" + "d" * 64,
        "report": {"flags": ["unknown_model"], "factors": [{"name": "model_trust", "fraction": 0.3}]},
        "submitted_ms": 1_717_312_200_000,
        "created_ms": 1_717_312_200_500,
    }
    listing = {"tasks": [task], "count": 1, "total": 60, "remaining": 10, "next": None}
    query = WorkbenchQuery(applicant="applicant-7", after="1717312100000:41")
    text = workbench_html(listing, "t", "alice", query, now_ms=1_717_312_200_500 + 3 * 3_600_000)
    assert "<span class='title'>Sunrise &lt;over&gt; the river</span>" in text
    assert '<a class="content" href="https://cdn.example.com/works/42.mp4" rel="noopener noreferrer"' in text
    assert "<span class='content-hash'>sha256:" + "c" * 64 in text
    assert "<span class='model-name'>home-made-diffuser</span><br><span class='model-version'>v2.1.0" in text
    assert "datetime='2024-06-02T07:10:00Z'" in text and "waiting 3 h 0 min" in text
    assert "<li class='hit'>unknown_model</li>" in text and "model_trust 0.30" in text
    assert "Tasks 51 to 51 of 60, oldest first." in text
    assert "id='first-page' href='/review?applicant=applicant-7'" in text and "next-page" not in text
    assert 'name="back" value="applicant=applicant-7&amp;after=1717312100000%3A41"' in text
    script = {**listing, "tasks": [{**task, "content_url": "javascript:alert(1)"}]}
    assert 'href="javascript' not in workbench_html(script, "t", "a")


def test_workbench_query_asks_the_review_workers_for_one_page() -> None:
    query = WorkbenchQuery.from_mapping(
        {"applicant": " applicant-7 ", "level": "P", "waiting": "1h", "after": "5:6", "bogus": "x"}
    )
    assert query == WorkbenchQuery("applicant-7", "P", "1h", "5:6")
    assert query.tasks_path(TASKS.path, now_ms=10_000_000) == (
        f"/v1/review/tasks?status=need_human&limit={PAGE_SIZE}&applicant_id=applicant-7&final_level=P"
        "&created_before_ms=6400000&after=5:6"
    )
    assert WorkbenchQuery.from_mapping({"level": "X", "waiting": "1y"}) == WorkbenchQuery()
    assert WorkbenchQuery.from_query_string(query.query_string()) == query
    assert query.link(after="9:9") == "/review?applicant=applicant-7&level=P&waiting=1h&after=9%3A9"


def test_console_key_and_peer_urls() -> None:
    dev = Settings(dev_mode=True, web_port=7000)
    assert ConsoleSettings().signing_key(dev) == ("dev", "dev-secret")
    assert ConsoleSettings().peer_url(dev, "review") == "http://127.0.0.1:7002"
    assert (
        ConsoleSettings(review_url="http://10.0.0.5:6068/").peer_url(dev, "review") == "http://10.0.0.5:6068"
    )
    prod = Settings(hmac_keys={"console": "a-long-console-secret-1234"})
    assert ConsoleSettings().signing_key(prod) is None  # no silent default outside dev mode
    assert ConsoleSettings(key_id="console").signing_key(prod) == ("console", "a-long-console-secret-1234")
    assert ConsoleSettings(key_id="missing").signing_key(prod) is None


async def test_record_counts_come_from_a_replica_named_earlier_when_the_configured_one_is_away() -> None:
    """The console's configured code URL is one replica; when it does not answer, the replicas the
    group's assignment named in the last answer are asked (each answers for every replica)."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from app.ops.console.peers import PeerError, Peers
    from testing.ports import free_port

    async def counts(request: web.Request) -> web.Response:
        return web.json_response({"counts": {"issued": 1}, "replicas": []})

    application = web.Application()
    application.router.add_get("/v1/avcc/record-counts", counts)
    server = TestServer(application, host="127.0.0.1")
    await server.start_server()
    try:
        away = f"http://127.0.0.1:{free_port()}"
        peers = Peers(Settings(dev_mode=True), ConsoleSettings(code_url=away, peer_timeout_s=2))
        answer = await peers.get_from_any("code", "/v1/avcc/record-counts", [str(server.make_url(""))])
        assert answer["counts"] == {"issued": 1}
        with pytest.raises(PeerError, match="unreachable"):
            await peers.get_from_any("code", "/v1/avcc/record-counts", [])
    finally:
        await peers.calls.close()
        await server.close()
