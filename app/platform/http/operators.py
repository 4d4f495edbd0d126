"""Operator login (HTTP Basic) of every page that is neither a signed ``/v1/`` endpoint nor a probe.

Open without a login: routes under ``/v1/`` (each one checks its HMAC signature itself), under
``/peer/`` (calls between workers, each checking its peer signature: :mod:`app.platform.http.peers`)
and the machine views :data:`OPEN_ROUTES` (``/health``, ``/ready``, ``/metrics``, and ``/openapi.json``:
public documentation). Everything else a worker
serves - the DLQ console, ``/records``, ``/lag``, ``/lag.json``, faust's index, any page added
later - answers only to an operator of ``settings.effective_operators()``: deny by default, so a
new page cannot be exposed by forgetting a decorator.

:class:`OperatorGuard` checks the ``Authorization`` header: Basic credentials decoded as UTF-8
(browsers send UTF-8 when the challenge says ``charset="UTF-8"``), the password compared in
constant time, and failed logins limited per client address and per client address + user
name (:class:`FailedLogins`): past a limit the guard answers 429 with ``Retry-After`` until the
window has passed, even for the right password, so guessing from one place stays slow. There is
no limit per user name alone: failures from other addresses never lock an operator out (during
an incident, someone hammering ``admin`` from elsewhere must not keep the people who have to act
out of the console). An IPv6 client counts by its /64 (one host usually holds a whole /64).
Every refusal of offered credentials, locked-out attempts included, is logged with the user name
and address and counted in ``avcc_operator_login_failures_total{reason}``.
:func:`operator_login` is the aiohttp middleware :func:`app.platform.faust.app.create_app`
installs on every worker.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from aiohttp import BasicAuth, web

from app.platform.http.counting import route_label
from app.platform.http.responses import json_error
from app.platform.metrics import OPERATOR_LOGIN_FAILURES
from app.platform.settings import Settings

__all__ = [
    "OPEN_ROUTES",
    "OPERATOR_ATTRIBUTE",
    "REALM",
    "FailedLogins",
    "OperatorGuard",
    "client_key",
    "is_open_route",
    "operator_login",
]

log = logging.getLogger(__name__)

#: Routes (as registered) every worker serves to machines without a login.
OPEN_ROUTES: Final = frozenset({"/health", "/ready", "/metrics", "/openapi.json"})
#: Routes under these prefixes authenticate themselves: HMAC-signed partner endpoints, and calls
#: between workers signed with the peer key.
SIGNED_PREFIX: Final = "/v1/"
PEER_PREFIX: Final = "/peer/"
#: ``request[OPERATOR_ATTRIBUTE]`` holds the operator name once the guard let a request in.
OPERATOR_ATTRIBUTE: Final = web.RequestKey("avcc_operator", str)
#: One realm for every operator page, so a browser reuses the login across them.
REALM: Final = "AVCC operator pages"

#: Failed logins tolerated within :data:`FAILURE_WINDOW_S` per client address, whatever the user
#: names (guessing or spraying names from one place), and per address + user name (one person
#: mistyping, or one name guessed from one place).
MAX_FAILURES_PER_ADDRESS: Final = 30
MAX_FAILURES_PER_ADDRESS_USER: Final = 10
FAILURE_WINDOW_S: Final = 300.0
#: Keys (addresses, address + user name pairs) remembered at most; the least recently failed are
#: forgotten first.
MAX_TRACKED_KEYS: Final = 10_000
#: Longest user name kept as a key or logged (longer names are cut).
_MAX_NAME: Final = 128

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_open_route(route: str) -> bool:
    """Whether the registered route ``route`` is served without an operator login."""
    return route.startswith((SIGNED_PREFIX, PEER_PREFIX)) or route in OPEN_ROUTES


def client_key(remote: str | None) -> str:
    """The key a client address counts under: the IPv4 address (an IPv4-mapped IPv6 one too), the
    /64 network of an IPv6 address, else the text as given (``unknown`` when there is none)."""
    if not remote:
        return "unknown"
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class FailedLogins:
    """Times of recent failed logins per key (an address, or an address and a user name),
    bounded in memory."""

    def __init__(self, limit: int, window_s: float, max_keys: int = MAX_TRACKED_KEYS) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._failures.get(key)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
        return times

    def retry_after(self, key: str, now: float) -> float:
        """Seconds until ``key`` may try again; 0 while it is under the limit."""
        times = self._recent(key, now)
        if len(times) < self.limit:
            return 0.0
        return times[-self.limit] + self.window_s - now

    def record(self, key: str, now: float) -> int:
        """Count a failure of ``key``; returns its failures within the window."""
        times = self._recent(key, now)
        times.append(now)
        self._failures[key] = times
        self._failures.move_to_end(key)
        while len(self._failures) > self.max_keys:
            self._failures.popitem(last=False)
        return len(times)

    def clear(self, key: str) -> None:
        """Forget the failures of ``key`` (after it logged in)."""
        self._failures.pop(key, None)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class OperatorGuard:
    """Checks operator logins against ``operators`` (name -> password), with the failure limits."""

    def __init__(
        self,
        operators: Mapping[str, str],
        *,
        address_limit: int = MAX_FAILURES_PER_ADDRESS,
        address_user_limit: int = MAX_FAILURES_PER_ADDRESS_USER,
        window_s: float = FAILURE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._digests = {name: _digest(password) for name, password in operators.items()}
        self._unknown = _digest("\x00no such operator\x00")
        self.by_address = FailedLogins(address_limit, window_s)
        self.by_address_user = FailedLogins(address_user_limit, window_s)
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: Settings) -> OperatorGuard:
        """The guard of the configured operators (``AVCC_OPERATOR_USERS``; dev: admin/admin)."""
        return cls(settings.effective_operators())

    @property
    def configured(self) -> bool:
        """Whether any operator can log in at all."""
        return bool(self._digests)

    def check(self, request: web.Request) -> str | web.Response:
        """The operator name of ``request``, or the answer refusing it (401, or 429 when locked)."""
        known = request.get(OPERATOR_ATTRIBUTE)
        if isinstance(known, str):
            return known
        header = request.headers.get("Authorization", "")
        if header[:6].lower() != "basic ":
            return self.challenge()
        address = client_key(request.remote)
        now = self._clock()
        wait = self.by_address.retry_after(address, now)
        if wait > 0:
            return self._locked(address, None, wait)
        try:
            creds = BasicAuth.decode(header, encoding="utf-8")
        except ValueError:
            return self._failed(address, None, now, "malformed")
        login, password = str(creds.login), str(creds.password)
        name = login[:_MAX_NAME]
        pair = _pair(address, name)
        wait = self.by_address_user.retry_after(pair, now)
        if wait > 0:
            return self._locked(address, name, wait)
        expected = self._digests.get(login)
        same = hmac.compare_digest(expected or self._unknown, _digest(password))
        if not same or expected is None:
            return self._failed(address, name, now, "bad_credentials")
        self.by_address_user.clear(pair)
        request[OPERATOR_ATTRIBUTE] = login
        return login

    def challenge(self) -> web.Response:
        """401 asking the browser for a Basic login (UTF-8)."""
        message = "operator login required"
        if not self.configured:
            message += " (no operator logins configured: set AVCC_OPERATOR_USERS)"
        return json_error(
            401,
            message,
            reason="login_required",
            headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
        )

    def _failed(self, address: str, name: str | None, now: float, reason: str) -> web.Response:
        from_address = self.by_address.record(address, now)
        as_name = self.by_address_user.record(_pair(address, name), now) if name is not None else 0
        OPERATOR_LOGIN_FAILURES.labels(reason).inc()
        log.warning(
            "operator login refused (%s): user %r from %s, %d recent failures from that address, "
            "%d of them for that user",
            reason,
            name,
            address,
            from_address,
            as_name,
        )
        return self.challenge()

    def _locked(self, address: str, name: str | None, wait_s: float) -> web.Response:
        OPERATOR_LOGIN_FAILURES.labels("locked_out").inc()
        log.warning("operator login locked out: user %r from %s for %.0fs more", name, address, wait_s)
        seconds = max(1, int(wait_s + 0.999))
        return json_error(
            429, f"too many failed logins; retry in {seconds}s", reason="locked_out", retry_after_s=seconds
        )


def _pair(address: str, name: str) -> str:
    """The :class:`FailedLogins` key of a user name tried from an address."""
    return f"{address}\n{name}"


def operator_login(guard: OperatorGuard) -> Callable[[web.Request, _Handler], Awaitable[web.StreamResponse]]:
    """aiohttp middleware: ``guard`` checks every matched route that is not open (see the module
    docstring); answers it lets through are marked ``Cache-Control: no-store``."""

    @web.middleware
    async def middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
        route = route_label(request)
        if route is None or is_open_route(route):
            return await handler(request)
        operator = guard.check(request)
        if isinstance(operator, web.Response):
            return operator
        response = await handler(request)
        if not response.prepared:
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    return middleware
