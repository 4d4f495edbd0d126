"""retry group (retry-svc): the App that runs the retry forwarder over ``topic.system.retry``.

What the forwarder does (due times, pausing, redelivery, dead-lettering): :mod:`app.ops.retry`.
Started with ``avcc worker retry`` (consumer group ``avcc-retry``), as the group's own consumer
(:mod:`app.platform.faust.own_consumer`); faust's own consumer stays off: this App has no agents.
"""

from __future__ import annotations

from app.ops.retry.forwarder import RetryForwarder
from app.platform.faust.app import get_app
from app.platform.faust.own_consumer import own_consumer

__all__ = ["app", "forwarder"]

app = get_app("retry")
#: The forwarder over the whole retry topic, run with the worker.
forwarder, common = own_consumer(app, "retry", RetryForwarder)
