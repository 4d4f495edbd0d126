"""Core agents in batches that own their offsets: what is processed, and when it is committed.

A core agent's input topics are declared ``acks=False`` (:func:`source_topic`), so faust keeps
no acks, gaps or commits for them; each agent reads ``stream.noack_take(N, within=...)`` batches
and :class:`BatchAgent` takes it from there, in the order Kafka Streams commits in:

1. **admit**: every message is checked against its partition's next expected offset
   (:class:`~app.platform.faust.cursor.Cursors`); only the next ones in line are processed,
   in offset order (a redelivery is dropped, a jump is fetched again);
2. **process**: each event goes through its group's processor (decode, dedup, handler, error
   policy: :mod:`app.platform.faust.runtime`); outputs are collected, table writes staged
   (later events of the batch read them), nothing is sent yet;
3. **outputs**: all of the batch's outputs are produced at once with the core profile and their
   acks awaited once;
4. **state**: the staged writes go to the tables' changelogs, acks awaited, then to the local
   stores (:func:`~app.platform.faust.tables.write_durably`); a refused write fails the batch;
5. **commit**: one commit of ``{partition: last processed + 1}``, at most every commit interval
   (offsets of quieter partitions are committed by the agent's watch; a revocation commits at
   once).

A batch whose outputs or writes cannot be made durable (the broker away) is processed again with
backoff, its partitions still held; events of a partition revoked meanwhile are given up (their
new owner processes them from the committed offset). A rebalance waits for the running batch
(:meth:`BatchAgent.revoke`, on faust's public ``on_partitions_revoked`` signal), so a batch
always commits in the generation that processed it; a commit refused anyway means a replay,
which the event-id dedup absorbs. Replays are safe throughout: outputs carry deterministic
event ids and every state change is keyed by the event ids it has seen.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import faust
from aiokafka.errors import CommitFailedError, IllegalStateError, RebalanceInProgressError
from faust.types import TP

from app.platform.faust import internals
from app.platform.faust.cursor import Cursors, OffsetSource
from app.platform.faust.recovery import wait_restored
from app.platform.faust.tables import Staged, Write, staging, write_durably
from app.platform.kafka.producers import EventProducer, Outbound
from app.platform.metrics import BATCH_EVENTS, BATCH_FAILURES, BATCH_SECONDS, COMMIT_FAILURES
from app.platform.topics import TopicSpec

__all__ = [
    "Batch",
    "BatchAgent",
    "FaustOffsets",
    "Process",
    "offsets_view",
    "source_topic",
]

log = logging.getLogger(__name__)

#: First and longest wait before a batch that could not be made durable is processed again.
RETRY_S: Final = (0.5, 10.0)
#: How often each agent checks for partitions whose tail was lost.
WATCH_S: Final = 2.0


def source_topic(app: Any, spec: TopicSpec, *more: TopicSpec) -> Any:
    """The faust topic a core agent reads ``spec`` (and ``more``, co-partitioned) from: raw bytes,
    ``acks=False`` (this module, not faust, decides what is processed and committed)."""
    return app.topic(
        spec.name,
        *(m.name for m in more),
        partitions=spec.partitions,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        acks=False,
    )


@dataclass(slots=True)
class Batch:
    """What processing a batch produced: outputs to send, writes staged, callbacks for after."""

    outputs: list[Outbound] = field(default_factory=list)
    staged: Staged = field(default_factory=Staged.empty)
    after: list[Callable[[], None]] = field(default_factory=list)

    def output(self, message: Outbound) -> None:
        """Produce ``message`` with the batch's outputs."""
        self.outputs.append(message)

    def stage(self, writes: Iterable[Write], event: Any) -> None:
        """Stage ``writes`` in the partition of ``event`` (tables are co-partitioned with it)."""
        partition = int(event.message.partition)
        for write in writes:
            self.staged.stage(write, partition)


#: Processes one event of a batch: adds its outputs, writes and callbacks to the batch. An
#: exception fails (and retries) the whole batch: handler errors are the processor's to judge.
Process = Callable[[Any, Batch], Awaitable[None]]


class FaustOffsets:
    """The cursors' view of faust's consumer: its public API, plus committed offsets read
    through :mod:`app.platform.faust.internals`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def assigned(self) -> set[TP]:
        """Partitions assigned to this worker (none before the consumer started)."""
        try:
            return set(self.app.consumer.assignment())
        except Exception:  # the consumer not started (or stopping)
            return set()

    async def starts(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The committed offset of each partition, else its first offset."""
        committed = await internals.committed(self.app, tps)
        starts = {tp: offset for tp, offset in committed.items() if offset is not None}
        for tp in committed.keys() - starts.keys():
            starts[tp] = await self.earliest(tp)
        return starts

    async def earliest(self, tp: TP) -> int:
        """The first offset ``tp`` still holds."""
        found = await self.app.consumer.earliest_offsets(tp)
        return int(next(iter(found.values())))

    async def seek(self, tp: TP, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next (on faust's consumer thread: :func:`internals.seek`)."""
        await internals.seek(self.app, tp, offset)

    def highwater(self, tp: TP) -> int | None:
        """The partition's end as of the last fetch."""
        try:
            value = self.app.consumer.highwater(tp)
        except Exception:  # not fetched yet, or not assigned any more
            return None
        return int(value) if value is not None else None


class BatchAgent:
    """Runs one faust agent's stream in batches with its own offsets (see the module doc)."""

    def __init__(
        self,
        app: Any,
        name: str,
        topics: Iterable[str],
        process: Process,
        producer: Callable[[], EventProducer],
        *,
        concurrency: int | None = None,
        max_events: int = 1000,
        within_s: float = 0.01,
        commit_interval_s: float = 0.2,
        source: OffsetSource | None = None,
        commit: Callable[[Mapping[TP, int]], Awaitable[None]] | None = None,
    ) -> None:
        """``source`` and ``commit`` default to faust's consumer (tests pass their own)."""
        self.app = app
        self.name = name
        self.process = process
        self.producer = producer
        self.concurrency = concurrency
        self.max_events = max_events
        self.within_s = within_s
        self.commit_interval_s = commit_interval_s
        self._committed_at = float("-inf")
        self.cursors = Cursors(name, frozenset(topics), source if source is not None else FaustOffsets(app))
        self._commit_offsets = commit if commit is not None else functools.partial(internals.commit, app)
        self.lock = asyncio.Lock()
        self.busy_since: float | None = None
        #: Offsets processed and not committed yet (a commit that failed is tried again).
        self._uncommitted: dict[TP, int] = {}
        #: Partitions being revoked: a batch retrying gives their events up.
        self._revoking: set[TP] = set()

    async def run(self, stream: Any) -> None:
        """Consume ``stream`` (an agent's) until the worker stops."""
        running = _RUNNING.setdefault(str(self.app.conf.id), [])
        running.append(self)
        watch = asyncio.ensure_future(self._watch())
        try:
            async for events in stream.noack_take(self.max_events, within=self.within_s):
                self.busy_since = time.monotonic()
                try:
                    await self.handle(events)
                finally:
                    self.busy_since = None
        finally:
            watch.cancel()
            running.remove(self)

    def describe(self, tp: TP) -> str:
        """What this agent knows of ``tp``: next offset, offset not committed yet, busy for."""
        busy = f"{time.monotonic() - self.busy_since:.0f}s" if self.busy_since is not None else "no"
        return (
            f"{tp.topic}[{tp.partition}] next={self.cursors.next_offset(tp)} "
            f"uncommitted={self._uncommitted.get(tp)} batch_running={busy}"
        )

    async def handle(self, events: Sequence[Any]) -> None:
        """Admit, process, make durable and commit one batch (once the App's tables are
        restored: a batch must read and write whole tables)."""
        await wait_restored(self.app)
        async with self.lock:
            if faust.current_event() is not None:  # reads would then see one partition only
                raise RuntimeError(f"{self.name}: a batch must run outside faust's per-event context")
            admitted = await self._admit(events)
            if not admitted:
                return
            started = time.perf_counter()
            processed = await self._until_durable(admitted)
            BATCH_EVENTS.labels(self.name).observe(len(processed))
            for event in processed:
                self._uncommitted[event.message.tp] = int(event.message.offset) + 1
            if time.monotonic() - self._committed_at >= self.commit_interval_s:
                await self._commit()
            BATCH_SECONDS.labels(self.name).observe(time.perf_counter() - started)

    async def _admit(self, events: Sequence[Any]) -> list[Any]:
        """The events next in line (asking again, with backoff, while the broker cannot say
        where a partition starts)."""
        delay = RETRY_S[0]
        while True:
            try:
                return await self.cursors.admit(events)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the coordinator moving: its committed offsets unknown for now
                log.warning(
                    "%s: partition starts unknown (%s); asking again in %.1f s", self.name, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_S[1])

    async def _until_durable(self, events: list[Any]) -> list[Any]:
        """Process ``events`` until their effects are durable (the broker away: again, with
        backoff); the events processed (without those of partitions revoked meanwhile)."""
        delay = RETRY_S[0]
        while True:
            if self._revoking:
                events = [e for e in events if e.message.tp not in self._revoking]
            try:
                await self._process(events)
                return events
            except asyncio.CancelledError:
                raise
            except Exception:
                BATCH_FAILURES.labels(self.name).inc()
                log.exception(
                    "%s: a batch of %d events was not made durable; again in %.1f s",
                    self.name,
                    len(events),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_S[1])

    async def _process(self, events: list[Any]) -> None:
        batch = Batch()
        with staging(batch.staged):
            if self.concurrency:
                await self._process_by_key(events, batch)
            else:
                for event in events:
                    await self.process(event, batch)
        producer = self.producer()
        await producer.send_batch(batch.outputs)
        await write_durably(producer, batch.staged)
        for callback in batch.after:
            callback()

    async def _process_by_key(self, events: list[Any], batch: Batch) -> None:
        """Events of one key one after the other, different keys at once (up to
        ``concurrency``): for processors that wait on something slow but shared, like a block."""
        by_key: dict[Any, list[Any]] = {}
        for event in events:
            by_key.setdefault(event.message.key, []).append(event)
        slots = asyncio.Semaphore(self.concurrency or 1)

        async def run(sequence: list[Any]) -> None:
            async with slots:
                for event in sequence:
                    await self.process(event, batch)

        results = await asyncio.gather(*(run(seq) for seq in by_key.values()), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _commit(self) -> None:
        """Commit every processed offset of the partitions still assigned; a failure leaves them
        for the next commit (or, after a rebalance, to the new owner's replay)."""
        self._committed_at = time.monotonic()
        assigned = self.cursors.source.assigned()
        offsets = {tp: o for tp, o in self._uncommitted.items() if tp in assigned}
        for tp in self._uncommitted.keys() - offsets.keys():
            del self._uncommitted[tp]
        if not offsets:
            return
        try:
            await self._commit_offsets(offsets)
        except (CommitFailedError, RebalanceInProgressError, IllegalStateError) as exc:
            COMMIT_FAILURES.labels(self.name, "rebalanced").inc()
            log.info(
                "%s: commit of %s refused (%s); left to the next commit", self.name, _names(offsets), exc
            )
            return
        except Exception as exc:  # the coordinator moving, the broker away
            COMMIT_FAILURES.labels(self.name, "unavailable").inc()
            log.warning(
                "%s: commit of %s failed (%s); left to the next commit", self.name, _names(offsets), exc
            )
            return
        for tp, offset in offsets.items():
            if self._uncommitted.get(tp) == offset:
                del self._uncommitted[tp]

    async def revoke(self, revoked: Iterable[TP]) -> None:
        """Partitions are being revoked: let the running batch finish (giving up their events if
        it is retrying) and commit, then forget them."""
        mine = {tp for tp in revoked if tp.topic in self.cursors.topics}
        if not mine:
            return
        self._revoking |= mine
        try:
            async with self.lock:
                await self._commit()
                self.cursors.forget(mine)
                for tp in mine:
                    self._uncommitted.pop(tp, None)
        finally:
            self._revoking -= mine

    async def _watch(self) -> None:
        """Commit what batches left uncommitted every commit interval (quiet partitions too);
        every :data:`WATCH_S` seek back lost tails."""
        tick = max(0.05, self.commit_interval_s)
        watched_at = time.monotonic()
        while True:
            await asyncio.sleep(tick)
            try:
                async with self.lock:
                    if self._uncommitted and time.monotonic() - self._committed_at >= self.commit_interval_s:
                        await self._commit()
                    if time.monotonic() - watched_at >= WATCH_S:
                        watched_at = time.monotonic()
                        await self.cursors.watch_tails()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the consumer restarting, the broker away: next round
                log.info("%s: offset watch skipped a round (%s)", self.name, exc)


#: The running batch agents of each App (by App id), for :func:`offsets_view`.
_RUNNING: dict[str, list[BatchAgent]] = {}


def offsets_view(app: Any, partitions: Iterable[tuple[str, int]]) -> str:
    """The batch agents' own view of ``partitions`` of ``app`` (for the stall watchdog's log)."""
    agents = _RUNNING.get(str(app.conf.id), [])
    parts: list[str] = []
    for topic, partition in partitions:
        owner = next((a for a in agents if topic in a.cursors.topics), None)
        tp = TP(topic, partition)
        parts.append(owner.describe(tp) if owner is not None else f"{topic}[{partition}] no batch agent")
    return "; ".join(parts)


def _names(offsets: dict[TP, int]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]={offset}" for tp, offset in sorted(offsets.items()))
