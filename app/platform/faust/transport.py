"""faust transport with the fixes the pipeline's delivery guarantees depend on.

faust-streaming 0.15 with aiokafka, adjusted in three places:

* **Fetch wait**: faust hard-codes aiokafka's ``fetch_max_wait_ms=1500``. A broker that answers a
  fetch only when that wait expires (Tansu does not return early when data arrives) then adds up
  to 1.5 s to every hop of the lifecycle; the wait is chosen per broker instead.
* **Acks of a previous generation**: after a rebalance faust skips the messages it fetched for
  the previous consumer generation, but still *acks* them. Those acks can advance the committed
  offset past messages the new generation has not processed yet, and a second rebalance then
  loses them (seen: 18 of 90 applications skipped around two rebalances). Such acks are dropped
  here: the messages are fetched again from the committed offset.
* **Commit with a gap at the head**: faust commits when the lowest acked offset is at most one
  past the committed offset (``min(acked) - committed > 1``), i.e. it tolerates one unacked
  message at the head. Here a commit needs the head itself to be acked.
* **A head that is never acked**: a message can be read and then never reach its stream (seen
  after a broker failover with replicas: ``committed=11 read=38 acked=[12..38]``); nothing fetches
  it again until the next rebalance, so the partition's commits stop for good and the stall
  watchdog restarts the worker after minutes. When the head has stayed unacked for
  :data:`HEAD_RESEEK_S` while later offsets were acked, the partition is fetched again from the
  head (every effect of the pipeline is safe to replay: duplicates are dropped by event id).
* **Stale read offsets**: faust drops fetched messages below the last offset it read from a
  partition, and keeps that offset across rebalances for partitions that have no committed
  offset yet. A partition that comes back after another generation read (but did not process)
  part of it is then re-fetched from the start and its unprocessed messages are dropped as
  "already read" (seen: 9 applications lost on one partition). Read offsets are reset before
  every seek to the committed offsets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types.tuples import ack_lock
from faust.utils.functional import consecutive_numbers
from mode.utils.objects import cached_property

from app.platform.metrics import HEAD_RESEEKS

__all__ = [
    "EARLY_ANSWER_FETCH_MAX_WAIT_MS",
    "FETCH_MAX_WAIT_MS",
    "HEAD_RESEEK_S",
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
#: How long a partition's head may stay unacked while later offsets are acked before the
#: partition is fetched again from the head (a message read but lost on its way to the stream).
#: Longer than a message legitimately stays in flight while later keys of its partition finish
#: (the chain submitter acks keys out of order; an EVM transaction waits for its confirmations),
#: shorter than the stall watchdog's restart (``AVCC_WORKER_STALL_S``, 120 s).
HEAD_RESEEK_S = 30.0
#: URL scheme that selects this transport (``avcc-kafka://host:port``).
SCHEME = "avcc-kafka"

log = logging.getLogger(__name__)


def _now() -> float:
    return time.monotonic()


#: Fetch wait per faust App id, chosen by :func:`app.platform.faust.app.get_app` for its broker.
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

    async def perform_seek(self) -> None:
        """Forget what earlier generations read, then seek to the committed offsets."""
        self._read_offset.clear()
        await super().perform_seek()

    def ack(self, message: Any) -> bool:
        """Record the ack, unless the message belongs to a previous consumer generation."""
        generation = getattr(message, "generation_id", None)
        if generation is not None and generation != self.app.consumer_generation_id:
            with ack_lock:
                message.acked = True  # done with it (not waited for at shutdown) ...
                self._unacked_messages.discard(message)
            return False  # ... but its offset is not committable: it is fetched again
        return bool(super().ack(message))

    @cached_property
    def _head_missing_since(self) -> dict[Any, tuple[int, float]]:
        """Per partition: the unacked head offset and since when later offsets were acked."""
        return {}

    @cached_property
    def _head_seeks(self) -> set[asyncio.Future[None]]:
        """Seeks in flight (kept referenced until done)."""
        return set()

    def _head_missing(self, tp: Any, head: int) -> None:
        """Fetch ``tp`` again from ``head`` once it stayed unacked for :data:`HEAD_RESEEK_S`."""
        now = _now()
        offset, since = self._head_missing_since.setdefault(tp, (head, now))
        if offset != head:
            self._head_missing_since[tp] = (head, now)
        elif now - since >= HEAD_RESEEK_S:
            self._head_missing_since[tp] = (head, now)  # at most one seek per period
            log.warning(
                "%s[%d]: offset %d never acked while later ones were: fetching again from it",
                tp.topic,
                tp.partition,
                head,
            )
            HEAD_RESEEKS.labels(str(self.app.conf.id), tp.topic).inc()
            task = asyncio.ensure_future(self._seek_head(tp, head))
            self._head_seeks.add(task)
            task.add_done_callback(self._head_seeks.discard)

    async def _seek_head(self, tp: Any, head: int) -> None:
        if tp in self.assignment():
            await self.seek(tp, head)

    def _new_offset(self, tp: Any) -> int | None:
        """The offset to commit: one past the acked run that starts at the committed offset."""
        acked: list[int] = self._acked[tp]
        if not acked:
            return None
        gaps = self._gap[tp]
        if gaps:  # offsets the broker never delivered (compaction, control records) count as acked
            highest = max(acked)
            for interval in sorted(gaps.overlap(0, highest), key=lambda i: i.begin):
                acked.extend(range(interval.begin, interval.end))
            gaps.chop(0, highest + 1)
        acked.sort()
        committed = self._committed_offset[tp]
        if committed is not None and acked[0] > committed:
            self._head_missing(tp, committed)
            return None  # the next message to commit has not been acked yet
        self._head_missing_since.pop(tp, None)
        batch = next(consecutive_numbers(acked))
        acked[: len(batch)] = []
        self._acked_index[tp].difference_update(batch)
        return int(batch[-1]) + 1


class Transport(faust_aiokafka.Transport):
    """The aiokafka transport with the fixes above."""

    Consumer = _Consumer


TRANSPORTS[SCHEME] = f"{__name__}:Transport"
