"""Counting of HTTP answers in ``avcc_http_requests_total``: one aiohttp middleware for every worker.

Every answer of a matched route is counted once, labelled ``route`` (the route template as
registered, e.g. ``/v1/avcc/records/{avcc_record_id}``), ``method`` and ``status`` - including
the refusals a view never sees as a success (401, 413, 429, 500 from an exception). Not counted:

* the worker's probe and scrape views (:data:`UNCOUNTED_ROUTES`), hit every few seconds by
  Prometheus and the orchestrator rather than by users;
* requests matching no route (their paths would be unbounded label values);
* calls from another worker (header :data:`~app.platform.http.peers.PEER_HEADER`): a request
  forwarded to the owner of a table partition, asked of every replica, or a peer call such as a
  claim: the worker that received the request from the client counts the answer it gives, so
  each client request is counted once.

:func:`app.platform.faust.app.create_app` installs it on every faust App's web server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from app.platform.http.peers import PEER_HEADER
from app.platform.metrics import HTTP_REQUESTS

__all__ = ["UNCOUNTED_ROUTES", "count_requests", "route_label"]

#: Routes of the common views every worker serves to machines (see ``install_common_views``).
UNCOUNTED_ROUTES: Final = frozenset({"/metrics", "/health", "/ready"})

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def route_label(request: web.Request) -> str | None:
    """The route template ``request`` matched, as registered (regex included); ``None`` when it
    matched no route."""
    resource = request.match_info.route.resource
    if resource is None:
        return None
    # aiohttp keeps the path as registered only privately; canonical drops the regex parts
    registered = getattr(resource, "_orig_path", None)
    return str(registered) if registered else resource.canonical


@web.middleware
async def count_requests(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Answer ``request`` and count the answer (see the module docstring)."""
    route = route_label(request)
    if route is None or route in UNCOUNTED_ROUTES or PEER_HEADER in request.headers:
        return await handler(request)
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        HTTP_REQUESTS.labels(route, request.method, str(status)).inc()
