"""The operator login of every worker page that is not signed or a probe, over a real aiohttp server."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.platform.http.operators import (
    MAX_FAILURES_PER_ADDRESS_USER,
    OPERATOR_ATTRIBUTE,
    FailedLogins,
    OperatorGuard,
    client_key,
    is_open_route,
    operator_login,
)
from app.platform.metrics import OPERATOR_LOGIN_FAILURES, REGISTRY
from app.platform.settings import Settings

Client = TestClient[web.Request, web.Application]

#: Pages a worker serves: probes and signed routes open, the rest operator pages.
OPERATOR_PAGES = ("/records", "/lag", "/lag.json", "/", "/dlq")
PAGES = ("/health", "/ready", "/metrics", "/v1/avcc/records/{avcc_record_id}", *OPERATOR_PAGES)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def failures(reason: str) -> float:
    return OPERATOR_LOGIN_FAILURES.labels(reason)._value.get()


async def _page(request: web.Request) -> web.Response:
    return web.Response(text=f"data for {request.get(OPERATOR_ATTRIBUTE)}")


def _app(guard: OperatorGuard) -> web.Application:
    app = web.Application(middlewares=[operator_login(guard)])
    for path in PAGES:
        app.router.add_get(path, _page)
    return app


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def client(clock: Clock) -> AsyncIterator[Client]:
    guard = OperatorGuard(
        {"admin": "admin", "操作员": "pässwörd ✓"},
        address_limit=5,
        address_user_limit=3,
        window_s=60,
        clock=clock,
    )
    async with TestClient(TestServer(_app(guard))) as test_client:
        yield test_client


def test_open_routes_are_the_signed_api_and_the_probes() -> None:
    assert all(is_open_route(r) for r in ("/health", "/ready", "/metrics", "/v1/avcc/applications"))
    assert not any(is_open_route(r) for r in ("/records", "/lag", "/lag.json", "/", "/dlq", "/v1", "/table"))


async def test_operator_pages_need_a_login_probes_and_signed_routes_do_not(client: Client) -> None:
    for path in ("/health", "/ready", "/metrics", "/v1/avcc/records/1"):
        response = await client.get(path)
        assert response.status == 200, path
    for path in OPERATOR_PAGES:
        response = await client.get(path)
        assert response.status == 401, path
        assert "data" not in await response.text()
        assert response.headers["WWW-Authenticate"] == 'Basic realm="AVCC operator pages", charset="UTF-8"'
    response = await client.get("/records", headers=basic("admin", "admin"))
    assert response.status == 200 and await response.text() == "data for admin"
    assert response.headers["Cache-Control"] == "no-store"
    assert (await client.get("/no/such/page")).status == 404


async def test_utf8_passwords_log_in(client: Client) -> None:
    response = await client.get("/lag", headers=basic("操作员", "pässwörd ✓"))
    assert response.status == 200 and await response.text() == "data for 操作员"
    assert (await client.get("/lag", headers=basic("操作员", "passwort"))).status == 401


async def test_failed_logins_are_logged_counted_and_limited_per_address(
    client: Client, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    bad_before, locked_before = failures("bad_credentials"), failures("locked_out")
    with caplog.at_level(logging.WARNING, logger="app.platform.http.operators"):
        for attempt in range(5):
            response = await client.get("/dlq", headers=basic(f"user{attempt}", "guess"))
            assert response.status == 401
        # the address is locked: even the right password waits
        locked = await client.get("/dlq", headers=basic("admin", "admin"))
    assert locked.status == 429 and 1 <= int(locked.headers["Retry-After"]) <= 60
    assert failures("bad_credentials") == bad_before + 5
    assert failures("locked_out") == locked_before + 1
    refused = [r.getMessage() for r in caplog.records if "operator login refused" in r.getMessage()]
    assert len(refused) == 5 and "'user4'" in refused[-1] and "127.0.0.1" in refused[-1]
    assert any("locked out" in r.getMessage() for r in caplog.records)
    clock.now += 61
    assert (await client.get("/dlq", headers=basic("admin", "admin"))).status == 200


async def test_malformed_credentials_count_as_failures(client: Client) -> None:
    before = failures("malformed")
    for header in ("Basic !!!notbase64", "Basic " + base64.b64encode(b"admin:\xff\xfe").decode()):
        response = await client.get("/records", headers={"Authorization": header})
        assert response.status == 401
    assert failures("malformed") == before + 2
    assert (await client.get("/records", headers={"Authorization": "Bearer x"})).status == 401
    assert failures("malformed") == before + 2  # not Basic at all: a plain challenge, not a failure


def _checker(guard: OperatorGuard) -> Callable[[str, str, str], int]:
    app = web.Application()

    def check(user: str, password: str, remote: str) -> int:
        request = make_mocked_request("GET", "/dlq", headers=basic(user, password), app=app)
        answer = guard.check(request.clone(remote=remote))
        return 200 if isinstance(answer, str) else answer.status

    return check


def test_failures_for_one_user_lock_that_address_and_name_only() -> None:
    clock = Clock()
    guard = OperatorGuard(
        {"admin": "admin"}, address_limit=100, address_user_limit=3, window_s=60, clock=clock
    )
    check = _checker(guard)
    assert [check("admin", "x", "10.0.0.1") for _ in range(3)] == [401, 401, 401]
    assert check("admin", "admin", "10.0.0.1") == 429  # that address and name wait
    assert check("other", "x", "10.0.0.1") == 401  # another name from there is not locked
    assert check("admin", "admin", "10.0.0.2") == 200  # nor the name from elsewhere
    clock.now += 60
    assert check("admin", "admin", "10.0.0.1") == 200


def test_ipv6_clients_count_by_their_64() -> None:
    guard = OperatorGuard({"admin": "admin"}, address_limit=2, address_user_limit=100, window_s=60)
    check = _checker(guard)
    assert check("a", "x", "2001:db8:1:2::1") == 401
    assert check("b", "x", "2001:db8:1:2:ffff::9") == 401
    assert check("admin", "admin", "2001:db8:1:2::77") == 429  # same /64
    assert check("admin", "admin", "2001:db8:1:3::1") == 200  # another /64
    assert client_key("::ffff:127.0.0.2") == "127.0.0.2"
    assert client_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert client_key(None) == "unknown"


async def test_failed_logins_from_three_addresses_do_not_stop_admin_from_a_fourth(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 26: 45 failed logins for ``admin`` from three other addresses (15 each) locked the
    real ``admin`` out everywhere for five minutes. With the default limits, each of the three
    addresses is stopped on its own; ``admin`` from a fourth address logs in; every failure is in
    the metrics and the log. Real HTTP over loopback, each client on its own source address."""
    server = TestServer(_app(OperatorGuard({"admin": "admin-pass"})), host="127.0.0.1")
    await server.start_server()
    before = {reason: scraped_failures(reason) for reason in ("bad_credentials", "locked_out")}
    answers: dict[str, list[int]] = {}
    try:
        with caplog.at_level(logging.WARNING, logger="app.platform.http.operators"):
            for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
                answers[source] = [
                    await _get(server, source, basic("admin", f"guess-{i}")) for i in range(15)
                ]
            operator = await _get(server, "127.0.0.5", basic("admin", "admin-pass"))
    finally:
        await server.close()
    assert operator == 200
    limit = MAX_FAILURES_PER_ADDRESS_USER
    for source, statuses in answers.items():  # each address stopped at its own limit
        assert statuses == [401] * limit + [429] * (15 - limit), source
    assert scraped_failures("bad_credentials") - before["bad_credentials"] == 3 * limit
    assert scraped_failures("locked_out") - before["locked_out"] == 3 * (15 - limit)
    messages = [r.getMessage() for r in caplog.records]
    for source in answers:
        refused = [m for m in messages if "login refused" in m and f"from {source}," in m]
        locked = [m for m in messages if "locked out" in m and f"from {source} " in m]
        assert len(refused) == limit and len(locked) == 15 - limit, source
        assert all("'admin'" in m for m in refused + locked)


async def _get(server: TestServer, source: str, headers: dict[str, str]) -> int:
    """One GET of an operator page from the local address ``source``."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(server.make_url("/dlq"), headers=headers) as response,
    ):
        return response.status


def scraped_failures(reason: str) -> float:
    """``avcc_operator_login_failures_total{reason}`` as ``/metrics`` exposes it."""
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for sample in family.samples:
            if sample.name == "avcc_operator_login_failures_total" and sample.labels == {"reason": reason}:
                return sample.value
    return 0.0


def test_failed_logins_forget_old_failures_and_stay_bounded() -> None:
    limits = FailedLogins(limit=2, window_s=10, max_keys=3)
    assert limits.record("a", 0) == 1 and limits.record("a", 5) == 2
    assert limits.retry_after("a", 6) == pytest.approx(4)
    assert limits.retry_after("a", 10.5) == 0  # the first failure left the window
    for key in ("b", "c", "d", "e"):
        limits.record(key, 11)
    assert limits.retry_after("e", 11) == 0 and len(limits._failures) == 3
    limits.clear("e")
    assert "e" not in limits._failures


def test_guard_of_the_settings_uses_the_operator_logins() -> None:
    guard = OperatorGuard.from_settings(Settings(operator_users={"ops": "pw"}, dev_mode=False))
    assert guard.configured
    assert not OperatorGuard.from_settings(Settings(operator_users={}, dev_mode=False)).configured
    assert b"AVCC_OPERATOR_USERS" in (OperatorGuard({}).challenge().body or b"")
