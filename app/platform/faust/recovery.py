"""Table recovery the project owns: bulk restores, warm standbys, and progress an operator can read.

faust restores a table partition by reading its changelog through its own consumer, one message
at a time through its per-event machinery: about 7,000 changelog records/s here, a million
works' tables in about five minutes, during which the partitions serve nothing. Its standby
copies go the same way and are applied only in buffers of 1,000 (a standby lags by up to that
many records, and a fresh standby replays the whole changelog at the same rate).

:class:`AvccTable` (the App's ``Table`` class) takes both into the project, through faust's
public ``Collection`` API, at every rebalance:

1. **plan** (:meth:`TableRecovery.plan`): for each changelog partition the worker now holds, its
   store's checkpoint (the changelog offset it holds, ``persisted_offset``) against the
   partition's high watermark:

   * an *active* partition behind its changelog gets a bounded range for the
     :class:`~app.platform.kafka.changelog.ChangelogReader` (checkpoint + 1 up to the high
     watermark): fetched in bulk, written through the store's write batches;
   * a *standby* partition gets a following range, kept warm as the changelog grows;
   * a store *ahead* of its changelog gets nothing: faust's consistency check stops the worker,
     as before (``EXIT_TABLES_AHEAD_OF_BROKER``).

   For every partition the reader takes, the table reports the high watermark it planned to as
   its persisted offset, so faust's own recovery has nothing left to read (its events of a
   followed standby are dropped; any that arrive for a partition still restoring are applied
   after the restore, in order).
2. **gates**: while an active partition is being restored, the group's batches wait
   (:func:`wait_restored`, called by the batch agents) and reads answer "recovering"
   (:func:`restoring`, checked by the owner-routing of HTTP reads and by ``/ready``).
3. **progress**: per table, records to go, records/s and an ETA (:meth:`TableRecovery.progress`),
   on ``/ready`` and in the metrics ``avcc_table_recovery_remaining``,
   ``avcc_table_recovery_seconds``, ``avcc_table_recovery_replayed_records`` and
   ``avcc_table_standby_lag_records``.

A restore that a rebalance interrupts resumes where the store got (every write batch moves the
checkpoint); a worker killed during one does too.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import faust
from faust.types import TP
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.platform.faust import internals
from app.platform.faust.tables import ChangelogEvent, same
from app.platform.kafka.changelog import Change, ChangelogRange, ChangelogReader, TopicPartitionKey
from app.platform.metrics import REGISTRY
from app.platform.settings import Settings

__all__ = [
    "EXIT_TABLES_AHEAD_OF_BROKER",
    "AvccTable",
    "Plan",
    "TableProgress",
    "TableRecovery",
    "plan_partitions",
    "restoring",
    "stop_status",
    "table_recovery",
    "tables_ahead_of_broker",
    "wait_restored",
]

log = logging.getLogger(__name__)

#: Longest wait for the high watermarks of a rebalance's partitions (asked within faust's
#: rebalance callback, during which the member sends no heartbeat: well below any session
#: timeout); past it, faust's own (slow) recovery reads them instead.
WATERMARK_TIMEOUT_S: Final = 2.0
#: Pause before asking again for changelog ends the broker refused (a leader moving).
WATERMARK_RETRY_S: Final = 0.25


def changelog_events(tp: TP, changes: Iterable[Change]) -> list[ChangelogEvent]:
    """``changes`` of changelog partition ``tp`` in the shape a store's ``apply_changelog_batch``
    reads."""
    return [ChangelogEvent(tp, c.offset, c.key, c.value) for c in changes]


@dataclass(frozen=True, slots=True)
class TableProgress:
    """How far the recovery of one table's partitions on this worker is."""

    table: str
    #: Changelog records still to restore on active partitions.
    remaining: int
    #: Changelog records the restores of active partitions started with.
    total: int
    #: Restore rate so far (records/s) and the time it still needs at that rate.
    records_per_s: float
    eta_s: float | None
    #: Records the standby partitions of this worker are behind their changelogs.
    standby_lag: int

    @property
    def recovering(self) -> bool:
        """Whether an active partition of the table is still being restored."""
        return self.remaining > 0

    def describe(self) -> str:
        """``records: recovering 1200 of 400000 changelog records, ETA 3 s``."""
        eta = f"ETA {self.eta_s:.0f} s" if self.eta_s is not None else "ETA unknown"
        return f"{self.table}: recovering {self.remaining} of {self.total} changelog records, {eta}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the ``/ready`` body)."""
        return {
            "table": self.table,
            "remaining": self.remaining,
            "total": self.total,
            "records_per_s": round(self.records_per_s),
            "eta_s": round(self.eta_s, 1) if self.eta_s is not None else None,
            "standby_lag": self.standby_lag,
        }


class TableRecovery:
    """The recovery of one App's tables (see the module doc)."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.app_id = str(app.conf.id)
        self.reader = ChangelogReader(
            {
                **settings.kafka_client_config(),
                "group.id": self.app_id,
                "client.id": f"{self.app_id}-restore",
            },
            self._apply,
            self._reached,
            name=self.app_id,
        )
        #: The offset each partition the reader took is reported at (to faust's recovery).
        self.claims: dict[TP, int] = {}
        #: faust's changelog events of partitions still restoring, applied once they are done.
        self._held: dict[TopicPartitionKey, list[Any]] = {}
        #: Records restored per table since the worker started.
        self.replayed: dict[str, int] = {}
        self._totals: dict[TopicPartitionKey, int] = {}
        #: The bounded ranges of the restore under way (added since the last time none was).
        self._round: list[ChangelogRange] = []
        #: The last restore: changelog records and seconds (first range started, last one done).
        self.last_restore: tuple[int, float] | None = None
        self._restored: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        _LIVE.add(self)

    # -- which table a changelog belongs to -------------------------------------------------

    def _table(self, topic: str) -> Any:
        for table in self.app.tables.values():
            if table.changelog_topic.get_topic_name() == topic:
                return table
        raise KeyError(topic)

    # -- the reader's callbacks (its thread) ---------------------------------------------------

    def _apply(self, key: TopicPartitionKey, changes: list[Change]) -> None:
        table = self._table(key[0])
        table.data.apply_changelog_batch(changelog_events(TP(*key), changes), to_key=same, to_value=same)
        self.replayed[table.name] = self.replayed.get(table.name, 0) + len(changes)

    def _reached(self, changelog_range: ChangelogRange) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_reached, changelog_range)

    def _on_reached(self, changelog_range: ChangelogRange) -> None:
        key = changelog_range.key
        seconds = (changelog_range.caught_up_at or time.monotonic()) - changelog_range.started
        what = "restored" if changelog_range.end is not None else "standby caught up:"
        log.info(
            "%s[%d] %s %d changelog records in %.1f s (%.0f/s)",
            key[0],
            key[1],
            what,
            changelog_range.applied,
            seconds,
            changelog_range.applied / seconds if seconds > 0 else 0.0,
        )
        held = self._held.pop(key, None)
        if held:
            self._table(key[0]).data.apply_changelog_batch(held, to_key=same, to_value=same)
        self._update_gate()

    # -- planning at a rebalance (the event loop) ---------------------------------------------

    async def release(self, table: Any, keep: set[TP]) -> None:
        """Stop reading the partitions of ``table`` not in ``keep`` (before its store closes
        them)."""
        topic = table.changelog_topic.get_topic_name()
        stale = [r.key for r in self.reader.ranges() if r.topic == topic and TP(*r.key) not in keep]
        for tp in [tp for tp in self.claims if tp.topic == topic and tp not in keep]:
            del self.claims[tp]
        if stale:
            await asyncio.to_thread(self.reader.remove, stale)
            for key in stale:
                self._held.pop(key, None)
        self._update_gate()

    async def plan(self, table: Any, actives: set[TP], standbys: set[TP]) -> None:
        """Give the reader what ``table``'s partitions on this worker need (see the module doc)."""
        self._loop = asyncio.get_running_loop()
        self.replayed.setdefault(table.name, 0)
        held = sorted(actives | standbys)
        if not held:
            return
        checkpoints = {tp: _checkpoint(table.data.persisted_offset(tp)) for tp in held}
        watermarks = await self._watermarks(table, held)
        if watermarks is None:
            await self._leave_to_faust(held)
            return
        current = {r.key: r for r in self.reader.ranges()}
        plan = plan_partitions(actives, standbys, checkpoints, watermarks, current)
        for tp, claim in plan.claims.items():
            if claim is None:
                self.claims.pop(tp, None)
            else:
                self.claims[tp] = claim
        if plan.dropped:
            await asyncio.to_thread(self.reader.remove, plan.dropped)
        if plan.ranges:
            restores = [r for r in plan.ranges if r.end is not None]
            for restore in restores:
                self._totals[restore.key] = restore.remaining
            self._round.extend(restores)
            await asyncio.to_thread(self.reader.add, plan.ranges)
            log.info(
                "%s: %s: restoring %d and following %d changelog partitions",
                self.app_id,
                table.name,
                len(restores),
                len(plan.ranges) - len(restores),
            )
        self._update_gate()

    async def _watermarks(self, table: Any, held: list[TP]) -> dict[TopicPartitionKey, int] | None:
        """The changelog ends of ``held``, asked again while :data:`WATERMARK_TIMEOUT_S` lasts (a
        leader election answers ``FENCED_LEADER_EPOCH`` or ``NOT_LEADER`` at once, for a moment);
        ``None`` when the broker does not tell in that time."""
        keys = [(tp.topic, tp.partition) for tp in held]
        deadline = time.monotonic() + WATERMARK_TIMEOUT_S
        while True:
            try:
                left = max(deadline - time.monotonic(), WATERMARK_RETRY_S)
                return await asyncio.to_thread(self.reader.high_watermarks, keys, left)
            except Exception as exc:  # the broker not answering (the detail is for the log)
                if time.monotonic() + WATERMARK_RETRY_S >= deadline:
                    log.warning(
                        "%s: changelog ends of %s unknown (%s); faust restores them from their stores",
                        self.app_id,
                        table.name,
                        exc,
                    )
                    return None
                await asyncio.sleep(WATERMARK_RETRY_S)

    async def _leave_to_faust(self, held: list[TP]) -> None:
        """Hand ``held`` to faust's own recovery, which restores each from its store's checkpoint.
        Nothing this recovery took of them before may stay: a claim would make faust skip what
        the store lacks, and a standby still followed would be served as current while behind."""
        keys = [(tp.topic, tp.partition) for tp in held]
        for tp in held:
            self.claims.pop(tp, None)
        await asyncio.to_thread(self.reader.remove, keys)
        for key in keys:
            self._held.pop(key, None)
        self._update_gate()

    def claimed(self, tp: TP) -> int | None:
        """The offset ``tp`` is reported at, if the reader took it."""
        return self.claims.get(tp)

    def intercept(self, table: Any, batch: Iterable[Any]) -> list[Any]:
        """faust's changelog events of ``batch`` that faust may apply now: those of followed
        standby partitions are dropped (the reader applies them), those of partitions still
        restoring are held until the restore is done."""
        passed: list[Any] = []
        for event in batch:
            tp = event.message.tp
            current = self.reader.get((tp.topic, tp.partition))
            if current is None or current.done:
                passed.append(event)
            elif current.end is not None:
                self._held.setdefault(current.key, []).append(event)
        return passed

    # -- gates ------------------------------------------------------------------------------

    def restoring(self) -> bool:
        """Whether an active partition is still being restored."""
        return any(r.end is not None and not r.done for r in self.reader.ranges())

    def _update_gate(self) -> None:
        if self._restored is None:
            self._restored = asyncio.Event()
        if self.restoring():
            self._restored.clear()
            return
        self._restored.set()
        finished = [r for r in self._round if r.done and r.caught_up_at is not None]
        if finished and self._loop is not None:
            # what was restored leaves the write-ahead log at once: a restart opens it in ms
            self._loop.create_task(asyncio.to_thread(self.flush))
        if finished:
            seconds = max(r.caught_up_at or 0.0 for r in finished) - min(r.started for r in finished)
            self.last_restore = (sum(r.applied for r in finished), seconds)
            log.info(
                "%s: tables restored: %d changelog records in %.1f s (%.0f/s)",
                self.app_id,
                self.last_restore[0],
                seconds,
                self.last_restore[0] / seconds if seconds > 0 else 0.0,
            )
        self._round = []

    async def wait_restored(self) -> None:
        """Return once no active partition is being restored."""
        if self._restored is None:
            self._update_gate()
        assert self._restored is not None
        await self._restored.wait()

    # -- progress ---------------------------------------------------------------------------

    def progress(self) -> list[TableProgress]:
        """Per table with partitions on this worker: the restore's progress and standby lag."""
        now = time.monotonic()
        by_table: dict[str, list[ChangelogRange]] = {}
        for changelog_range in self.reader.ranges():
            by_table.setdefault(changelog_range.topic, []).append(changelog_range)
        found: list[TableProgress] = []
        for topic, ranges in sorted(by_table.items()):
            try:
                name = str(self._table(topic).name)
            except KeyError:
                continue
            restoring = [r for r in ranges if r.end is not None and not r.done]
            remaining = sum(r.remaining for r in restoring)
            total = sum(self._totals.get(r.key, r.remaining) for r in restoring)
            rate = sum(r.rate(now) for r in restoring)
            eta = remaining / rate if rate > 0 else None
            lag = sum(r.remaining for r in ranges if r.end is None)
            found.append(TableProgress(name, remaining, total, rate, eta, lag))
        return found

    def flush(self) -> int:
        """Flush every table's open stores out of RocksDB's write-ahead log (blocking): a worker
        opens its partitions again in milliseconds instead of replaying the log (see
        :func:`internals.flush_stores`). How many stores were flushed."""
        return sum(internals.flush_stores(table) for table in list(self.app.tables.values()))

    def close(self) -> None:
        """Stop the reader and flush the stores (the worker stops)."""
        self.reader.close()
        self.flush()


@dataclass(slots=True)
class Plan:
    """What a rebalance changes in the reading of one table's partitions on this worker."""

    #: Ranges to read from now on (replacing any range of the same partition).
    ranges: list[ChangelogRange] = field(default_factory=list)
    #: Partitions no longer to read.
    dropped: list[TopicPartitionKey] = field(default_factory=list)
    #: The offset each partition is reported at to faust's recovery (``None``: its store's own).
    claims: dict[TP, int | None] = field(default_factory=dict)


def plan_partitions(
    actives: set[TP],
    standbys: set[TP],
    checkpoints: Mapping[TP, int],
    highs: Mapping[TopicPartitionKey, int],
    reading: Mapping[TopicPartitionKey, ChangelogRange],
) -> Plan:
    """What to read of each partition held (see the module doc), from its store's checkpoint
    (``-1``: empty), its changelog's high watermark and what the reader reads already.

    * a store ahead of its changelog: nothing read, no claim (faust's consistency check);
    * an active partition: a restore under way goes on; a store behind gets a bounded range
      from its checkpoint to the high watermark; a current one (a standby promoted) stops being
      followed;
    * a standby partition: followed from its checkpoint (a following range goes on).
    """
    plan = Plan()
    for tp in sorted(actives | standbys):
        key = (tp.topic, tp.partition)
        high = highs[key]
        checkpoint = checkpoints[tp]
        existing = reading.get(key)
        start = checkpoint + 1  # below the changelog's first offset: the reader starts at that one
        if checkpoint >= high:
            plan.claims[tp] = None
            if existing is not None:
                plan.dropped.append(key)
        elif tp in actives and existing is not None and existing.end is not None and not existing.done:
            plan.claims[tp] = existing.end - 1
        elif tp in actives and start >= high:
            plan.claims[tp] = None
            if existing is not None:
                plan.dropped.append(key)
        elif tp in actives:
            plan.ranges.append(ChangelogRange(tp.topic, tp.partition, start, high))
            plan.claims[tp] = high - 1
        else:
            if existing is None or existing.end is not None:
                plan.ranges.append(ChangelogRange(tp.topic, tp.partition, start, None, high=high))
            plan.claims[tp] = high - 1
    return plan


def _checkpoint(persisted: int | None) -> int:
    """A store's persisted offset, ``-1`` when it holds none."""
    return -1 if persisted is None else int(persisted)


#: Exit status of a worker whose tables are ahead of the broker's changelogs (sysexits' EX_DATAERR).
EXIT_TABLES_AHEAD_OF_BROKER: Final = 65


def tables_ahead_of_broker(app: Any) -> BaseException | None:
    """faust's ``ConsistencyError`` if that is what crashed ``app``, else ``None``."""
    from faust.exceptions import ConsistencyError

    reason = getattr(app, "crash_reason", None)
    return reason if isinstance(reason, ConsistencyError) else None


def stop_status(app: Any) -> int:
    """The exit status of a worker of ``app`` that stops now: :data:`EXIT_TABLES_AHEAD_OF_BROKER`
    when its tables are ahead of the broker, 1 when it crashed otherwise, else 0."""
    if tables_ahead_of_broker(app) is not None:
        return EXIT_TABLES_AHEAD_OF_BROKER
    return 1 if getattr(app, "crashed", False) else 0


def table_recovery(app: Any) -> TableRecovery | None:
    """The project's recovery of ``app``'s tables (``None`` for an App without one)."""
    found = getattr(app, "table_recovery", None)
    return found if isinstance(found, TableRecovery) else None


def restoring(app: Any) -> bool:
    """Whether ``app`` is restoring an active table partition (reads must wait)."""
    recovery = table_recovery(app)
    return recovery is not None and recovery.restoring()


async def wait_restored(app: Any) -> None:
    """Return once ``app`` restores no active table partition (a batch may then run)."""
    recovery = table_recovery(app)
    if recovery is not None:
        await recovery.wait_restored()


class AvccTable(faust.Table[bytes, bytes]):
    """faust's Table with the project's recovery (see the module doc): only public
    ``Collection`` methods are extended."""

    async def on_rebalance(
        self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP], generation_id: int = 0
    ) -> None:
        """Release the partitions leaving, let the store open and close its partitions, plan
        the restores and standbys of the partitions held now."""
        recovery = table_recovery(self.app)
        if recovery is None:
            await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
            return
        topic = self.changelog_topic.get_topic_name()
        actives = {tp for tp in self.app.assignor.assigned_actives() if tp.topic == topic}
        standbys = {tp for tp in self.app.assignor.assigned_standbys() if tp.topic == topic} - actives
        await recovery.release(self, actives | standbys)
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        await recovery.plan(self, actives, standbys)

    def persisted_offset(self, tp: TP) -> int | None:
        """The offset the project's recovery takes ``tp`` to, else the store's checkpoint."""
        recovery = table_recovery(self.app)
        claimed = recovery.claimed(tp) if recovery is not None else None
        return claimed if claimed is not None else super().persisted_offset(tp)

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        """faust's recovery applying changelog events: only those the project's recovery does
        not read itself."""
        recovery = table_recovery(self.app)
        events = recovery.intercept(self, batch) if recovery is not None else list(batch)
        if events:
            super().apply_changelog_batch(events)


#: Every TableRecovery of this process, for the metrics collector.
_LIVE: weakref.WeakSet[TableRecovery] = weakref.WeakSet()


class _RecoveryCollector(Collector):
    """Exports the progress of every live :class:`TableRecovery` at each scrape."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["app", "table"]
        remaining = GaugeMetricFamily(
            "avcc_table_recovery_remaining",
            "Changelog records this worker still restores into a table before serving it",
            labels=labels,
        )
        seconds = GaugeMetricFamily(
            "avcc_table_recovery_seconds",
            "Estimated seconds until the table's restore on this worker is done (0: not restoring)",
            labels=labels,
        )
        replayed = GaugeMetricFamily(
            "avcc_table_recovery_replayed_records",
            "Changelog records restored into the table (restores and standby) since the worker started",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "avcc_table_standby_lag_records",
            "Changelog records this worker's standby copies of the table are behind",
            labels=labels,
        )
        for recovery in list(_LIVE):
            for item in recovery.progress():
                values = [recovery.app_id, item.table]
                remaining.add_metric(values, item.remaining)
                seconds.add_metric(values, item.eta_s or 0.0)
                lag.add_metric(values, item.standby_lag)
            for table, count in recovery.replayed.items():
                replayed.add_metric([recovery.app_id, table], count)
        last_records = GaugeMetricFamily(
            "avcc_table_recovery_last_records",
            "Changelog records the worker's last completed restore read (all its tables)",
            labels=["app"],
        )
        last_seconds = GaugeMetricFamily(
            "avcc_table_recovery_last_seconds",
            "Seconds the worker's last completed restore took (first partition started, last done)",
            labels=["app"],
        )
        for recovery in list(_LIVE):
            if recovery.last_restore is not None:
                last_records.add_metric([recovery.app_id], recovery.last_restore[0])
                last_seconds.add_metric([recovery.app_id], recovery.last_restore[1])
        yield from (remaining, seconds, replayed, lag, last_records, last_seconds)


REGISTRY.register(_RecoveryCollector())
