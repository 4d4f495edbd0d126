"""Security headers on every answer of a worker's web server (and the console's own application).

Operator pages carry buttons with side effects (re-inject, discard); a page of another site
must not frame them and trick a logged-in operator into clicking (clickjacking passes the
console's Origin check, the click being a genuine same-origin POST). So every answer says:

* ``X-Frame-Options: DENY`` and ``Content-Security-Policy: ... frame-ancestors 'none'`` - never
  framed (the first for old browsers);
* a CSP allowing nothing but the pages' inline styles and same-origin forms (no scripts), except
  on the lag page, whose policy adds same-origin scripts and fetches (:data:`LIVE_PAGE_POLICY`:
  the console's one script, ``/console/live.js``, which keeps the numbers live);
* ``X-Content-Type-Options: nosniff`` - a JSON or text body is never sniffed into HTML.

Headers a view set itself are kept.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Final

from aiohttp import web

__all__ = ["CONTENT_SECURITY_POLICY", "LIVE_PAGE_POLICY", "SECURITY_HEADERS", "security_headers"]

#: The pages use inline ``<style>`` and ``style=`` only; forms post to their own origin.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
#: The lag page's policy: the same, plus the console's one script and its fetch of the page,
#: both from the worker's own origin (still no inline script, no other origin).
LIVE_PAGE_POLICY: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
}

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _add(headers: MutableMapping[str, str]) -> None:
    for name, value in SECURITY_HEADERS.items():
        headers.setdefault(name, value)


@web.middleware
async def security_headers(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Answer ``request`` with :data:`SECURITY_HEADERS` added (error answers raised as
    ``HTTPException``, e.g. aiohttp's 404, included)."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _add(exc.headers)
        raise
    if not response.prepared:
        _add(response.headers)
    return response
