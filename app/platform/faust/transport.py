"""faust transport with the fixes the pipeline's delivery guarantees depend on.

faust-streaming 0.15 with aiokafka, adjusted where the delivery guarantees need it:

* **Fetch wait**: faust hard-codes aiokafka's ``fetch_max_wait_ms=1500``. A broker that answers a
  fetch only when that wait expires (Tansu does not return early when data arrives) then adds up
  to 1.5 s to every hop of the lifecycle; the wait is chosen per broker instead, and on such a
  broker an idle consumer backs off to a longer one (:mod:`app.platform.faust.idle_fetch`).
* **Acks of a previous generation**: after a rebalance faust skips the messages it fetched for
  the previous consumer generation, but still *acks* them. Those acks can advance the committed
  offset past messages the new generation has not processed yet, and a second rebalance then
  loses them (seen: 18 of 90 applications skipped around two rebalances). Such acks are dropped
  here: the messages are fetched again from the committed offset.
* **Commit with a gap at the head**: faust commits when the lowest acked offset is at most one
  past the committed offset (``min(acked) - committed > 1``), i.e. it tolerates one unacked
  message at the head. Here a commit needs the head itself to be acked.
* **A head that is lost on its way**: a message can be read and then never reach its stream
  (seen after a broker failover with replicas: ``committed=11 read=38 acked=[12..38]``; and, with
  nothing after it, a record posted during a rebalance that stayed ``submitted``). faust stamps a
  batch fetched before a rebalance with the generation current when the fetch *returns*, and
  drops every later message below the last offset it read, so the re-fetch after the seek can be
  discarded as "already read". Nothing fetches such a head again until the next rebalance: the
  partition's commits stop for good. A head is taken for lost when, for :data:`HEAD_RESEEK_S`,
  it exists (later offsets were acked, or the fetcher read up to it and the high watermark is
  past it), it is not acked, and no stream holds it (it is not among the tracked, unacked
  messages); the partition is then fetched again from the head. Every effect of the pipeline
  is safe to replay (duplicates are dropped by event id), and a head a stream still works on
  (the chain submitter acks keys out of order) is never re-fetched.
* **A partition whose committed offset is unknown**: faust learns a partition's committed offset
  when it seeks to it after an assignment, and records none when the group has not committed
  one, or when the lookup found none (a coordinator moving in a failover). It then committed the
  first acked run, wherever it started (seen: a restarted code replica got
  ``review.task.finished[4]`` committed at 1, first processed offsets 14 and 15 and committed
  16, so 1..13 were never relayed: records issued without their review result). Here nothing is
  committed for such a partition until its start is known -- the group's committed offset from
  the broker, else the partition's first offset --; a run that does not begin there waits for
  its head, which the head watch fetches again.
* **Offsets a fetch jumped over**: faust takes a jump in the offsets it fetches for a partition
  for a gap the broker never delivers (compaction, transaction markers) and counts it as acked.
  No stream topic here is compacted or transactional, so a jump is messages the fetch skipped
  (seen: ``apply.created[1]`` read 3, then 17, and 4..16 were committed unprocessed: a record
  stayed ``submitted``). They stay unacked here and the head watch fetches them again; only a
  head that retention already deleted is skipped over.
* **Fetches that jump ahead are not delivered**: a fetch can return a partition's messages from
  past where its last delivered message (or the seek) left it (seen: ``claims[0]`` read up to 2,
  then 15). Delivering them let later messages overtake earlier ones of the same key: a retried
  application at offset 18 was claimed before the original request at offset 7, whose first
  owner had emitted its ``apply.created`` and then died, so one work got two records. Such
  messages are dropped and the partition is fetched again from the expected offset, so every
  stream topic is processed in offset order; only a range retention already deleted is skipped
  (and after :data:`MAX_REWINDS` rewinds to the same offset the jump is let through, leaving the
  skipped offsets to the head watch below). A stream partition whose next offset is not known
  (a seek to its start that failed while a leader moved, or a fetch landing while the seek to
  the committed offsets is still asking the coordinator) delivers nothing either: it is fetched
  again from its start, the group's committed offset or else its first offset (seen: after a
  failover a restarted replica claimed a retried application at ``claims[2]`` offset 65 before
  the original request at 5, whose first owner had emitted its ``apply.created``: two records).
* **Nothing is delivered to a stream during a rebalance**: faust resumes fetching the stream
  partitions (the flow already runs, for the changelogs) before it seeks them to the committed
  offsets and before the rebalance ends; messages its streams got in that window were never
  processed (seen: a restarted review replica got ``apply.created[0]`` 7..24 then and none of
  them was processed, while 25.., fetched after, were; on ``claims`` a retried application then
  overtook the lost original request: two records). Stream messages fetched while the app is
  rebalancing are held back, and once the rebalance ended their partitions are fetched again
  from the next offset they owe.
* **Flush before a commit**: faust flushes the producer before it commits offsets, but its
  buffer's flush returns as soon as no buffered message is sent within 0.1 s (a broker failover
  stalls them for seconds), and a refused changelog write is only logged. A commit could then
  cover input whose table writes never reached the changelog: a worker SIGKILLed after it lost
  them for good (seen: the claims table's record-id counter, so a new owner handed out an id
  that was already taken). Here a flush returns only once every buffered message is
  acknowledged, and raises when one was refused, so that commit does not happen.
* **Stale read offsets**: faust drops fetched messages below the last offset it read from a
  partition, and keeps that offset across rebalances for partitions that have no committed
  offset yet. A partition that comes back after another generation read (but did not process)
  part of it is then re-fetched from the start and its unprocessed messages are dropped as
  "already read" (seen: 9 applications lost on one partition). Read offsets are reset before
  every seek to the committed offsets, and a stream partition without a committed offset is
  sought to its first offset: aiokafka keeps the position an earlier generation fetched up to
  (seen: a replica that kept ``claims[0]`` across a rebalance went on at offset 23 while the
  original request at 3 was unprocessed).
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

from app.platform.faust import producer
from app.platform.faust.idle_fetch import IdleFetchBackoff
from app.platform.metrics import FETCH_HELD_BACK, FETCH_SKIPS, HEAD_RESEEKS

__all__ = [
    "EARLY_ANSWER_FETCH_MAX_WAIT_MS",
    "FETCH_MAX_WAIT_MS",
    "HEAD_RESEEK_S",
    "MAX_REWINDS",
    "SCHEME",
    "Transport",
    "fetch_max_wait_ms",
    "idle_fetch_max_wait_ms",
    "set_fetch_max_wait_ms",
]

#: Longest time a fetch waits for data on a broker that does not answer early (Tansu); idle
#: consumers poll this often, so it trades idle CPU for per-hop latency.
FETCH_MAX_WAIT_MS = 50
#: Fetch wait on brokers that answer as soon as data arrives (Apache Kafka).
EARLY_ANSWER_FETCH_MAX_WAIT_MS = 500
#: How long a partition's head may stay unacked, read and held by no stream, before the
#: partition is fetched again from the head (a message read but lost on its way to the stream).
#: Longer than a message legitimately waits in a stream's buffer, shorter than the stall
#: watchdog's restart (``AVCC_WORKER_STALL_S``, 120 s).
HEAD_RESEEK_S = 15.0
#: Rewinds to one offset after which a fetch that keeps jumping past it is let through.
MAX_REWINDS = 5
#: First and longest wait before asking again for a partition's start (committed offset).
START_RETRY_S = 0.2
START_RETRY_MAX_S = 5.0
#: URL scheme that selects this transport (``avcc-kafka://host:port``).
SCHEME = "avcc-kafka"

log = logging.getLogger(__name__)


def _now() -> float:
    return time.monotonic()


#: Fetch waits per faust App id, chosen by :func:`app.platform.faust.app.get_app` for its broker:
#: (busy, idle); see :mod:`app.platform.faust.idle_fetch`.
_FETCH_WAIT_MS: dict[str, tuple[int, int]] = {}


def set_fetch_max_wait_ms(app_id: str, wait_ms: int, idle_wait_ms: int | None = None) -> None:
    """Use ``wait_ms`` as the fetch wait of the App ``app_id``, backing off to ``idle_wait_ms``
    while its fetches come back empty (``None``: no backoff)."""
    _FETCH_WAIT_MS[app_id] = (wait_ms, max(wait_ms, idle_wait_ms or wait_ms))


def _fetch_waits(app: Any) -> tuple[int, int]:
    """(busy, idle) fetch waits of ``app``; the early-answer default, no backoff, if none was set."""
    return _FETCH_WAIT_MS.get(str(app.conf.id), (EARLY_ANSWER_FETCH_MAX_WAIT_MS,) * 2)


def fetch_max_wait_ms(app: Any) -> int:
    """The fetch wait of ``app`` (the early-answer default if none was set)."""
    return _fetch_waits(app)[0]


def idle_fetch_max_wait_ms(app: Any) -> int:
    """The longest fetch wait ``app`` backs off to while idle."""
    return _fetch_waits(app)[1]


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = fetch_max_wait_ms(self.app)
        return consumer

    async def on_start(self) -> None:
        """Start the consumer; an idle one then backs off its fetches (see ``idle_fetch``)."""
        await super().on_start()
        backoff = IdleFetchBackoff(*_fetch_waits(self.app))
        fetcher = getattr(self._consumer, "_fetcher", None)
        if backoff.enabled and fetcher is not None:
            backoff.install(fetcher)


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def perform_seek(self) -> None:
        """Forget what earlier generations read, then seek to the committed offsets; a stream
        partition without one is sought to its first offset: aiokafka keeps the position an
        earlier generation fetched up to (so its unprocessed messages were overtaken), and the
        jump guard needs to know where the partition starts."""
        self._read_offset.clear()
        self._delivered.clear()
        self._sought.clear()
        await super().perform_seek()
        for tp in self.assignment():
            if tp.topic in self.app.topics.acking_topics and self._read_offset.get(tp) is None:
                try:
                    await self.seek(tp, await self._earliest_offset(tp))
                except Exception as exc:  # a leader moving: the jump guard stays off for it
                    log.info("%s[%d]: not sought to its start (%s)", tp.topic, tp.partition, exc)

    async def seek(self, partition: Any, offset: int) -> None:
        """faust's seek, remembering the offset (faust keeps a seek to 0 as no read offset)."""
        await super().seek(partition, offset)
        self._sought[partition] = offset
        self._delivered.pop(partition, None)

    @cached_property
    def _sought(self) -> dict[Any, int]:
        """Per partition: the offset of the last seek."""
        return {}

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
    def _rewinds(self) -> dict[Any, tuple[int, int]]:
        """Per partition: the offset it is being fetched again from, and how often it was."""
        return {}

    @cached_property
    def _rewinding(self) -> dict[Any, asyncio.Future[None]]:
        """Rewinds in flight (kept referenced until done)."""
        return {}

    async def getmany(self, timeout: float) -> Any:  # noqa: ASYNC109 - faust's signature
        """faust's fetch, without messages past a jump in a stream partition's offsets, nor
        stream messages fetched while the app is rebalancing (see :meth:`_hold_back`)."""
        app = self.app
        if self._held_back and not app.rebalancing:
            self._fetch_held_back_again()
        acking_topics = app.topics.acking_topics
        async for tp, message in super().getmany(timeout):
            if app.rebalancing and tp.topic in acking_topics:
                self._hold_back(tp)
                continue
            offset = message.offset
            if self._jumped(tp, offset):
                continue
            read = self._read_offset.get(tp)
            if read is None or offset >= read:  # what faust delivers (it drops the rest)
                self._delivered[tp] = offset
            yield tp, message

    @cached_property
    def _held_back(self) -> set[Any]:
        """Stream partitions with messages fetched, and not delivered, while rebalancing."""
        return set()

    def _hold_back(self, tp: Any) -> None:
        """Keep a stream message fetched during a rebalance from its stream: its partition is
        fetched again once the rebalance ended. faust resumes fetching the stream partitions
        before its seek to the committed offsets and before the rebalance ends, and messages
        streams got in that window were lost (seen: a restarted review replica got
        ``apply.created[0]`` 7..24 during its first rebalance and processed none of them,
        then 25.. after it; a lost claim request let a retry overtake it: two records)."""
        if tp not in self._held_back:
            self._held_back.add(tp)
            FETCH_HELD_BACK.labels(str(self.app.conf.id), tp.topic).inc()

    def _fetch_held_back_again(self) -> None:
        """The rebalance ended: fetch each held-back partition again from its next offset."""
        held = set(self._held_back)
        self._held_back.clear()
        for tp in held:
            if tp in self._rewinding or not self._assigned(tp):
                continue
            expected = self._next_offset(tp)
            rewind = self._rewind_to_start(tp) if expected is None else self._rewind(tp, expected)
            self._start_rewind(tp, rewind)

    def _jumped(self, tp: Any, offset: int) -> bool:
        """Whether ``offset`` lies past the next offset ``tp`` should deliver (a rewind is then
        started: the message is fetched again in order)."""
        if tp in self._rewinding:
            return True  # the rest of a batch fetched before the rewind's seek
        if tp.topic not in self.app.topics.acking_topics:
            return False
        expected = self._next_offset(tp)
        if expected is None:
            self._start_rewind(tp, self._rewind_to_start(tp))
            return True
        if offset <= expected:
            return False
        rewound_to, times = self._rewinds.get(tp, (expected, 0))
        times = times + 1 if rewound_to == expected else 1
        self._rewinds[tp] = (expected, times)
        if times > MAX_REWINDS:
            log.error(
                "%s[%d]: fetches keep jumping from %d to %d; letting it through",
                tp.topic,
                tp.partition,
                expected,
                offset,
            )
            return False
        log.warning(
            "%s[%d]: fetched offset %d where %d was next: fetching again from %d",
            tp.topic,
            tp.partition,
            offset,
            expected,
            expected,
        )
        FETCH_SKIPS.labels(str(self.app.conf.id), tp.topic).inc(offset - expected)
        self._start_rewind(tp, self._rewind(tp, expected))
        return True

    def _start_rewind(self, tp: Any, rewind: Any) -> None:
        """Run ``rewind`` (a coroutine seeking ``tp``); ``tp`` delivers nothing until it is done."""
        task = asyncio.ensure_future(rewind)
        self._rewinding[tp] = task
        task.add_done_callback(lambda _: self._rewinding.pop(tp, None))

    def _next_offset(self, tp: Any) -> int | None:
        """The offset ``tp`` delivers next (``None``: unknown). faust's read offset is the last
        message delivered, or where a seek put the partition (then it is the next one)."""
        read = self._read_offset.get(tp)
        if read is None:
            return self._sought.get(tp)
        return int(read) + 1 if read == self._delivered.get(tp) else int(read)

    @cached_property
    def _delivered(self) -> dict[Any, int]:
        """Per partition: the offset of the last message handed to its stream."""
        return {}

    async def _rewind(self, tp: Any, offset: int) -> None:
        """Fetch ``tp`` again from ``offset``, or from the first offset retention left (a failed
        seek leaves the skipped offsets to the head watch)."""
        try:
            if self._assigned(tp):
                await self.seek(tp, max(offset, await self._earliest_offset(tp)))
        except Exception as exc:  # a leader moving
            log.warning("%s[%d]: not fetched again from %d (%s)", tp.topic, tp.partition, offset, exc)

    async def _rewind_to_start(self, tp: Any) -> None:
        """Fetch ``tp`` again from where its processing starts: the next offset a seek to the
        committed offsets set meanwhile, else the group's committed offset (else the first
        offset). Always seeks, as what was fetched during the lookup was dropped; a failed
        lookup is asked again (backing off) while ``tp`` stays assigned."""
        delay = START_RETRY_S
        while self._assigned(tp):
            try:
                start = await self._partition_start(tp)
                if not self._assigned(tp):
                    return
                known = self._next_offset(tp)
                start = start if known is None else known
                log.warning(
                    "%s[%d]: fetched with its next offset unknown: fetching again from %d",
                    tp.topic,
                    tp.partition,
                    start,
                )
                await self.seek(tp, start)
                return
            except Exception as exc:  # the coordinator or a leader moving
                log.warning("%s[%d]: start not found (%s); asking again", tp.topic, tp.partition, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, START_RETRY_MAX_S)

    @cached_property
    def _head_missing_since(self) -> dict[Any, tuple[int, float]]:
        """Per partition: the head offset that looks lost and since when it does."""
        return {}

    @cached_property
    def _head_seeks(self) -> set[asyncio.Future[None]]:
        """Seeks in flight (kept referenced until done)."""
        return set()

    def _head_may_be_lost(self, tp: Any, head: int, later_acked: bool) -> bool:
        """Whether ``head`` exists, was read and is not acked, with the partition flowing."""
        if not self.flow_active or self.app.in_recovery or not self._assigned(tp):
            return False
        if tp in self._paused_partitions or tp in self._buffered_partitions:
            return False  # held back on purpose (recovery, a full stream buffer)
        if later_acked:
            return True
        read = self._read_offset.get(tp)
        if read is None or read < head:
            return False
        try:
            highwater = self.highwater(tp)
        except Exception:  # not assigned (any more) or no fetch yet: nothing to judge by
            return False
        return highwater is not None and highwater > head

    def _assigned(self, tp: Any) -> bool:
        """Whether ``tp`` is assigned to this consumer (``False`` before it started)."""
        try:
            return tp in self.assignment()
        except Exception:  # the consumer thread not started (or stopping)
            return False

    def _head_in_stream(self, tp: Any, head: int) -> bool:
        """Whether a stream holds ``head`` (tracked and not acked yet)."""
        return any(m.offset == head and m.tp == tp and not m.acked for m in list(self._unacked_messages))

    def _watch_head(self, tp: Any, head: int, later_acked: bool) -> None:
        """Fetch ``tp`` again from ``head`` once it looked lost for :data:`HEAD_RESEEK_S`."""
        if not self._head_may_be_lost(tp, head, later_acked):
            self._head_missing_since.pop(tp, None)
            return
        now = _now()
        offset, since = self._head_missing_since.setdefault(tp, (head, now))
        if offset != head:
            self._head_missing_since[tp] = (head, now)
        elif now - since >= HEAD_RESEEK_S:
            self._head_missing_since[tp] = (head, now)  # at most one look per period
            if self._head_in_stream(tp, head):
                return  # slow, not lost
            log.warning(
                "%s[%d]: offset %d read but never acked nor held by a stream: fetching again from it",
                tp.topic,
                tp.partition,
                head,
            )
            HEAD_RESEEKS.labels(str(self.app.conf.id), tp.topic).inc()
            task = asyncio.ensure_future(self._seek_head(tp, head))
            self._head_seeks.add(task)
            task.add_done_callback(self._head_seeks.discard)

    async def _seek_head(self, tp: Any, head: int) -> None:
        """Fetch ``tp`` again from ``head``; a head retention already deleted is skipped over."""
        if not self._assigned(tp):
            return
        earliest = await self._earliest_offset(tp)
        if earliest > head:  # nothing to fetch again: the range counts as done
            self._gap[tp].addi(head, earliest)
            return
        await self.seek(tp, head)

    async def _earliest_offset(self, tp: Any) -> int:
        """The first offset ``tp`` still holds."""
        earliest = await self._thread.earliest_offsets(tp)
        return int(next(iter(earliest.values())))

    async def _add_gap(self, tp: Any, offset_from: int, offset_to: int) -> None:
        """A fetch that jumped over offsets of a stream topic: faust counted them as acked
        (compaction, transaction markers), but no stream topic here is compacted or written in
        transactions, so they are messages the fetch skipped. They stay unacked, and the head
        watch fetches them again."""
        log.warning(
            "%s[%d]: fetched offset %d right after %d: not taking the offsets between as processed",
            tp.topic,
            tp.partition,
            offset_to,
            offset_from - 1,
        )
        FETCH_SKIPS.labels(str(self.app.conf.id), tp.topic).inc(max(0, offset_to - offset_from))

    def _filter_tps_with_pending_acks(self, topics: Any = None) -> Any:
        """faust's partitions with acks, plus every assigned one: a partition whose only message
        was lost has no acks, and its head must still be watched at every commit."""
        tps = set(self._acked) | set(self.assignment())
        return (tp for tp in tps if topics is None or tp in topics or tp.topic in topics)

    @cached_property
    def _start_lookups(self) -> dict[Any, asyncio.Future[None]]:
        """Per partition: the lookup of its committed offset in flight (kept referenced)."""
        return {}

    def _look_up_start(self, tp: Any) -> None:
        """Start finding where ``tp``'s processing starts (once per partition at a time)."""
        if tp in self._start_lookups:
            return
        task = asyncio.ensure_future(self._learn_start(tp))
        self._start_lookups[tp] = task
        task.add_done_callback(lambda _: self._start_lookups.pop(tp, None))

    async def _learn_start(self, tp: Any) -> None:
        """Take ``tp``'s committed offset from the broker (its first offset if it has none) as
        the offset its commits must start from; acks below it are already committed."""
        try:
            start = await self._partition_start(tp)
        except Exception as exc:  # the coordinator is moving: asked again at the next commit
            log.info("%s[%d]: committed offset unknown for now (%s)", tp.topic, tp.partition, exc)
            return
        if self.app.rebalancing or not self._assigned(tp) or self._committed_offset[tp] is not None:
            return  # (a partition revoked meanwhile must not keep a start: asked again later)
        with ack_lock:
            self._committed_offset[tp] = start
            below = [offset for offset in self._acked[tp] if offset < start]
            self._acked[tp][:] = [offset for offset in self._acked[tp] if offset >= start]
            self._acked_index[tp].difference_update(below)
        log.info("%s[%d]: commits start from offset %d", tp.topic, tp.partition, start)

    async def _partition_start(self, tp: Any) -> int:
        """The group's committed offset of ``tp``, or its first offset if it never committed."""
        thread = self._thread
        consumer = thread._ensure_consumer()
        committed = await thread.call_thread(consumer.committed, faust_aiokafka.ensure_aiokafka_TP(tp))
        if committed is not None:
            return int(committed)
        return await self._earliest_offset(tp)

    def _new_offset(self, tp: Any) -> int | None:
        """The offset to commit: one past the acked run that starts at the committed offset."""
        acked: list[int] = self._acked[tp]
        committed = self._committed_offset[tp]
        if committed is None and acked and tp.topic in self.app.topics.acking_topics:
            self._look_up_start(tp)
            return None  # where the run must start is unknown: nothing is committed yet
        if not acked:
            if committed is not None and tp.topic in self.app.topics.acking_topics:
                self._watch_head(tp, committed, later_acked=False)
            return None
        gaps = self._gap[tp]
        if gaps:  # offsets the broker never delivered (compaction, control records) count as acked
            highest = max(acked)
            for interval in sorted(gaps.overlap(0, highest), key=lambda i: i.begin):
                acked.extend(range(interval.begin, interval.end))
            gaps.chop(0, highest + 1)
        acked.sort()
        if committed is not None and acked[0] > committed:
            self._watch_head(tp, committed, later_acked=True)
            return None  # the next message to commit has not been acked yet
        self._head_missing_since.pop(tp, None)
        batch = next(consecutive_numbers(acked))
        acked[: len(batch)] = []
        self._acked_index[tp].difference_update(batch)
        return int(batch[-1]) + 1


class Transport(faust_aiokafka.Transport):
    """The aiokafka transport with the fixes above."""

    Consumer = _Consumer
    Producer = producer.Producer


TRANSPORTS[SCHEME] = f"{__name__}:Transport"
