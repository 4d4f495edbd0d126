"""retry group (retry-svc): the App that runs the retry forwarder over ``topic.system.retry``.

What the forwarder does (due times, pausing, redelivery, dead-lettering): :mod:`app.ops.retry`.
Started with ``avcc worker retry`` (consumer group ``avcc-retry``); faust's own consumer stays
off: this App has no agents.
"""

from __future__ import annotations

from typing import Any

from app.ops.retry.forwarder import RetryForwarder
from app.platform.faust.app import get_app
from app.platform.http.views import install_common_views

__all__ = ["RetryService", "app"]

app = get_app("retry")
#: The running forwarder (set when the worker starts it), for ``/ready`` and the lag export.
_running: list[RetryForwarder] = []


def _assignment() -> list[tuple[str, int]]:
    return _running[0].assignment() if _running else []


common = install_common_views(app, "retry", assignment=_assignment)


@app.service
class RetryService(RetryForwarder):
    """The retry group's forwarder over the whole retry topic."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _running[:] = [self]
