"""Idle fetch backoff: an idle consumer on a broker that never answers a fetch early polls less.

Tansu answers a fetch only when its wait expires, so the workers fetch with a short wait
(``FETCH_MAX_WAIT_MS``, 50 ms) to keep every hop of the lifecycle quick. Each of those fetches
costs the broker about 1.5 ms of CPU plus 0.1 ms per partition, answered or not: four idle core
workers kept the embedded broker at ~93 % of a core (measured), more than the whole lifecycle
costs at 20 applications/s. Once a consumer's fetches have come back empty for
:data:`IDLE_AFTER_S`, each further empty fetch doubles its wait, up to
``AVCC_KAFKA_IDLE_FETCH_MAX_WAIT_MS``; the first fetch that returns records puts it back to the
short wait. A consumer that gets anything at least once a second never backs off (backing off
after every empty fetch cost latency under load: at 50 applications/s p99 apply -> code went
from 0.6 s to 2.0 s); the first message after an idle spell waits at most the idle wait.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

__all__ = ["IDLE_AFTER_S", "IdleFetchBackoff", "next_fetch_wait_ms"]

#: How long a consumer's fetches must have found nothing before it backs off.
IDLE_AFTER_S: Final = 1.0


def next_fetch_wait_ms(
    current_ms: int, got_records: bool, idle_for_s: float, busy_ms: int, idle_ms: int
) -> int:
    """The wait of the next fetch: ``busy_ms`` after records or before :data:`IDLE_AFTER_S` of
    nothing (``idle_for_s``), else ``current_ms`` doubled, at most ``idle_ms``."""
    if got_records or idle_for_s < IDLE_AFTER_S or idle_ms <= busy_ms:
        return busy_ms
    return max(busy_ms, min(idle_ms, current_ms * 2))


class IdleFetchBackoff:
    """Adjusts an aiokafka ``Fetcher``'s wait after each fetch it makes (see the module doc)."""

    def __init__(self, busy_ms: int, idle_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.busy_ms = busy_ms
        self.idle_ms = max(busy_ms, idle_ms)
        self.clock = clock
        #: When a fetch last returned records (or the backoff was installed).
        self.last_records = clock()

    @property
    def enabled(self) -> bool:
        """Whether there is anything to back off to."""
        return self.idle_ms > self.busy_ms

    def next_wait(self, current_ms: int, got_records: bool) -> int:
        """The wait after a fetch that did (not) return records."""
        now = self.clock()
        if got_records:
            self.last_records = now
        return next_fetch_wait_ms(
            current_ms, got_records, now - self.last_records, self.busy_ms, self.idle_ms
        )

    def install(self, fetcher: Any) -> None:
        """Wrap ``fetcher``'s fetch routine (aiokafka looks it up on the instance per fetch)."""
        fetch: Callable[[Any, Any, Any], Awaitable[bool]] = fetcher._proc_fetch_request

        async def fetch_and_adjust(assignment: Any, node_id: Any, request: Any) -> bool:
            got_records = await fetch(assignment, node_id, request)
            fetcher._fetch_max_wait_ms = self.next_wait(fetcher._fetch_max_wait_ms, bool(got_records))
            return got_records

        fetcher._fetch_max_wait_ms = self.busy_ms
        fetcher._proc_fetch_request = fetch_and_adjust
