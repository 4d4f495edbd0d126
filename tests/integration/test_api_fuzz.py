"""No 5xx from any input: schemathesis over every route of every worker that serves ``/v1/`` routes.

The code, review and settlement workers of the session's core stack, plus a gateway and a sink
worker (ClickHouse) started here on the same broker (with an ops worker, whose console renders the
merged document at ``/docs``), each fuzzed through the ``/openapi.json`` it serves: signed with a
key holding every scope and unsigned, each with cases that fit the document and cases that break it
(signed, the hook replaces broken signing headers; unsigned, they reach the server). Every answer
must be documented (status, content type, body schema) and none may be a 5xx other than the
documented 503. A summary line per worker and run goes to the terminal, past pytest's output
capture, with the seed the cases came from (fixed in ``make test``; see ``api_fuzz.py``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from openapi_spec_validator import validate
from schemathesis import GenerationMode

from testing.clickhouse import ClickHouseServer
from tests.integration.api_fuzz import FuzzSummary, HmacAuth, call_documented, fuzz_seed, fuzz_worker
from tests.integration.stack import API_KEY, API_SECRET, Stack, application, wait_for

pytestmark = [pytest.mark.timeout(1200)]

#: (auth, cases per operation, generation mode) of each run against each worker; the case
#: counts are the budget (``make fuzz`` multiplies them by ``AVCC_FUZZ_EXAMPLES_SCALE``).
RUNS = (
    (HmacAuth(API_KEY, API_SECRET), 40, GenerationMode.POSITIVE),
    (HmacAuth(API_KEY, API_SECRET), 40, GenerationMode.NEGATIVE),
    (None, 10, GenerationMode.POSITIVE),
    (None, 20, GenerationMode.NEGATIVE),  # malformed X-AVCC-* headers among others
)
EXAMPLES_SCALE = int(os.environ.get("AVCC_FUZZ_EXAMPLES_SCALE", "1"))
#: The ``/v1/`` routes each worker must document.
V1_ROUTES = {
    "code": {
        "/v1/avcc/applications",
        "/v1/avcc/applications:batch",
        "/v1/avcc/records/{avcc_record_id}",
        "/v1/avcc/record-counts",
        "/v1/avcc/time-to-code",
    },
    "review": {"/v1/review/tasks", "/v1/review/tasks/{avcc_record_id}/decision"},
    "settlement": {"/v1/settlement/instructions", "/v1/settlement/instructions/{instruction_id}"},
    "gateway": {"/v1/playback/events"},
    "sink": {"/v1/playback/stats", "/v1/playback/anomalies"},
}
PROBES = {"/health", "/ready", "/metrics", "/openapi.json"}
RECORD = "/v1/avcc/records/{avcc_record_id}"


@pytest.fixture(scope="module")
def playback_workers(
    stack_broker: Any, clickhouse_server: ClickHouseServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A gateway, a sink (its own ClickHouse database) and an ops worker, for the module's three
    tests (none stops or kills them)."""
    unique = uuid.uuid4().hex[:10]
    database = clickhouse_server.url.rsplit("/", 1)[0] + f"/api_fuzz_{unique}"
    env = {"AVCC_CLICKHOUSE_URL": database}
    stack = Stack(stack_broker.bootstrap, tmp_path_factory.mktemp("playback"), env=env)
    try:
        stack.start("gateway", "sink", "ops")
        yield stack
    finally:
        stack.stop_all()


def _report(request: pytest.FixtureRequest, summaries: list[FuzzSummary]) -> None:
    """Print the summary lines past pytest's capture, so they show in CI's ``-q`` output too."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print()
        for summary in summaries:
            print(summary.line(), flush=True)


def _urls(core_stack: Stack, playback_workers: Stack) -> dict[str, str]:
    urls = {group: core_stack.url(group) for group in ("code", "review", "settlement")}
    return urls | {group: playback_workers.url(group) for group in ("gateway", "sink")}


def test_each_worker_serves_a_valid_document_of_its_own_routes(
    core_stack: Stack, playback_workers: Stack
) -> None:
    for group, url in _urls(core_stack, playback_workers).items():
        response = requests.get(url + "/openapi.json", timeout=10)
        assert response.status_code == 200
        document = response.json()
        validate(document)
        assert set(document["paths"]) == V1_ROUTES[group] | PROBES, group


def test_the_console_renders_the_partner_document_for_operators_only(playback_workers: Stack) -> None:
    url = playback_workers.url("ops") + "/docs"
    assert requests.get(url, timeout=10).status_code == 401
    page = requests.get(url, auth=("operator", "operator-pass"), timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    for path in set().union(*V1_ROUTES.values()):
        assert f"<code>{path}</code>" in page.text
    assert requests.get(playback_workers.url("ops") + "/openapi.json", timeout=10).status_code == 200


def test_an_issued_record_and_its_application_answer_as_documented(core_stack: Stack) -> None:
    """The fuzzer's record ids are random (404s): check a real, issued record's 200 too."""
    url, auth = core_stack.url("code"), HmacAuth(API_KEY, API_SECRET)
    applied = call_documented(url, "POST", "/v1/avcc/applications", auth, body=application())
    assert applied.status_code == 202
    record_id = applied.json()["avcc_record_id"]

    def issued() -> Any:
        answer = call_documented(url, "GET", RECORD, auth, path_parameters={"avcc_record_id": str(record_id)})
        return answer if answer.status_code == 200 and answer.json().get("avcc_code") else None

    record = wait_for(issued, 90, interval=0.5)
    assert len(record.json()["history"]) >= 3


def test_no_route_answers_5xx_or_off_document(
    core_stack: Stack, playback_workers: Stack, request: pytest.FixtureRequest
) -> None:
    summaries: list[FuzzSummary] = []
    seed = fuzz_seed()
    try:
        for group, url in _urls(core_stack, playback_workers).items():
            for auth, examples, mode in RUNS:
                fuzzed = fuzz_worker(
                    group, url, auth, max_examples=examples * EXAMPLES_SCALE, seed=seed, mode=mode
                )
                summaries.append(fuzzed)
    finally:
        _report(request, summaries)
    for summary in summaries:
        # schemathesis leaves out the route that serves the document itself
        documented = {label.split(" ", 1)[1] for label in summary.operations}
        assert documented == V1_ROUTES[summary.worker] | PROBES - {"/openapi.json"}, summary.line()
        if summary.mode == "signed/pos":
            assert summary.v1_accepted > 0, f"no signed call got in: {summary.line()}"
        if summary.mode.startswith("unsigned"):
            assert summary.v1_accepted == 0, f"an unsigned call got in: {summary.line()}"
        assert not [op for op in summary.not_negatable if " /v1/" in op], summary.not_negatable
    assert sum(s.server_errors for s in summaries) == 0
    failures = [f"{s.worker}/{s.mode}: {failure}" for s in summaries for failure in s.failures]
    assert not failures, "\n\n".join(failures)
