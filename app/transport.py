"""faust transport with a short consumer fetch wait, for low per-hop latency.

faust 0.15 hard-codes aiokafka's ``fetch_max_wait_ms=1500``. A broker that answers a fetch only
when that wait expires (Tansu does not return early when data arrives) then adds up to 1.5 s to
every hop of the lifecycle. The wait is lowered to ``FETCH_MAX_WAIT_MS`` on the worker consumer
before it starts (aiokafka reads the attribute when it builds its fetcher).
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = [
    "EARLY_ANSWER_FETCH_MAX_WAIT_MS",
    "FETCH_MAX_WAIT_MS",
    "SCHEME",
    "Transport",
    "fetch_max_wait_ms",
    "set_fetch_max_wait_ms",
]

#: Longest time a fetch waits for data on a broker that does not answer early (Tansu); idle
#: consumers poll this often, so it trades idle CPU for per-hop latency.
FETCH_MAX_WAIT_MS = 50
#: Fetch wait on brokers that answer as soon as data arrives (Apache Kafka).
EARLY_ANSWER_FETCH_MAX_WAIT_MS = 500
#: URL scheme that selects this transport (``avcc-kafka://host:port``).
SCHEME = "avcc-kafka"


#: Fetch wait per faust App id, chosen by :func:`app.faust_app.get_app` for its broker.
_FETCH_WAIT_MS: dict[str, int] = {}


def set_fetch_max_wait_ms(app_id: str, wait_ms: int) -> None:
    """Use ``wait_ms`` as the fetch wait of the App ``app_id``."""
    _FETCH_WAIT_MS[app_id] = wait_ms


def fetch_max_wait_ms(app: Any) -> int:
    """The fetch wait of ``app`` (the early-answer default if none was set)."""
    return _FETCH_WAIT_MS.get(str(app.conf.id), EARLY_ANSWER_FETCH_MAX_WAIT_MS)


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = fetch_max_wait_ms(self.app)
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    """The aiokafka transport with :data:`FETCH_MAX_WAIT_MS`."""

    Consumer = _Consumer


TRANSPORTS[SCHEME] = f"{__name__}:Transport"
