"""Every worker's own consumer-lag export, and the stall watchdog fed by its readings.

A small service exports ``avcc_consumer_lag_messages`` for the partitions assigned to THIS
worker (end offset - committed offset of its group), so a scrape of any worker shows its share of
its group's lag; series of partitions the worker loses in a rebalance are removed. The same
readings feed the stall watchdog (:mod:`app.platform.lag.watchdog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import faust
from mode import Service

from app.platform.faust.app import consumer_group_id
from app.platform.faust.batches import offsets_view
from app.platform.faust.readiness import AssignmentSource, faust_consumer_of
from app.platform.faust.recovery import table_recovery
from app.platform.lag.bounded import call_within
from app.platform.lag.reader import OffsetReader
from app.platform.lag.settings import LagReadSettings, get_lag_read_settings
from app.platform.lag.snapshot import PartitionOffsets
from app.platform.lag.watchdog import (
    RecoveryWatch,
    StallWatchdog,
    exit_recovery_stalled,
    exit_stalled,
)
from app.platform.metrics import CONSUMER_LAG, LAG_MONITOR_ERRORS
from app.platform.settings import Settings, get_settings

__all__ = ["EXPORT_TIMEOUTS", "WorkerLagExporter", "lag_export_service", "recovery_remaining"]

log = logging.getLogger(__name__)


#: A worker's lag reading is given up after this many of the reader's request timeouts.
EXPORT_TIMEOUTS = 3


class WorkerLagExporter:
    """Exports the lag of the partitions assigned to this worker into ``CONSUMER_LAG``."""

    def __init__(
        self,
        app: faust.App,
        group: str,
        *,
        settings: Settings | None = None,
        config: LagReadSettings | None = None,
        reader_factory: Callable[[], OffsetReader] | None = None,
        assignment: AssignmentSource | None = None,
    ) -> None:
        self.app = app
        self.group_id = consumer_group_id(group)
        self._settings = settings
        self._config = config if config is not None else get_lag_read_settings()
        self._reader_factory = reader_factory
        self._assignment = assignment
        self._reader: OffsetReader | None = None
        self._exported: set[tuple[str, str, str]] = set()

    def _get_reader(self) -> OffsetReader:
        if self._reader is None:
            if self._reader_factory is not None:
                self._reader = self._reader_factory()
            else:
                timeout = self._config.request_timeout_s
                self._reader = OffsetReader(self._settings or get_settings(), request_timeout_s=timeout)
        return self._reader

    def assigned(self) -> list[tuple[str, int]]:
        """Source partitions assigned to this worker (changelogs, the reply topic and faust's leader
        topic excluded)."""
        if self._assignment is not None:
            try:
                return sorted(set(self._assignment()))
            except Exception:  # the group's own consumer is not up: nothing assigned
                return []
        consumer = faust_consumer_of(self.app)
        if consumer is None:
            return []
        try:
            assignment = consumer.assignment()
        except Exception:  # consumer not started (yet): nothing assigned
            return []
        skip: set[str] = set(self.app.tables.changelog_topics)
        skip.add(str(self.app.conf.reply_to))  # replies are never committed (ack-free topic)
        skip |= set(getattr(consumer, "randomly_assigned_topics", ()) or ())
        return sorted(
            (tp.topic, tp.partition)
            for tp in assignment
            if tp.topic not in skip
            and "-__assignor-__leader" not in tp.topic
            and not tp.topic.startswith("__")
        )

    def export_timeout_s(self) -> float:
        """Longest wait for one reading: a few of the reader's request timeouts."""
        return EXPORT_TIMEOUTS * self._config.request_timeout_s

    async def export_once(self) -> list[PartitionOffsets]:
        """Read and export the lag of the assigned partitions once.

        A reading that does not answer within :meth:`export_timeout_s` is given up and its reader
        dropped (closed once its call returns, :func:`call_within`); the next round asks a fresh
        one. Seen after an Apache Kafka restart: the reader's ``committed()`` never returned,
        every later round waited behind it, and the stall watchdog, fed by these readings, never
        fired while the worker's commits had stopped for 13 minutes.
        """
        tps = self.assigned()
        rows: list[PartitionOffsets] = []
        if tps:
            reader = self._get_reader()
            timeout = self.export_timeout_s()
            try:
                read = partial(reader.group_offsets, self.group_id, tps)
                rows = await call_within(read, timeout, reader.close)
            except TimeoutError:
                LAG_MONITOR_ERRORS.labels(stage="worker_export").inc()
                log.warning(
                    "lag export of %s did not answer in %.0f s; asking a new reader next round",
                    self.group_id,
                    timeout,
                )
                if self._reader is reader:
                    self._reader = None
                return []
            except Exception as exc:  # the broker may be away for a moment; try again next round
                LAG_MONITOR_ERRORS.labels(stage="worker_export").inc()
                log.warning("lag export of %s failed: %s", self.group_id, exc)
                return []
        current: set[tuple[str, str, str]] = set()
        for row in rows:
            labels = (row.group, row.topic, str(row.partition))
            CONSUMER_LAG.labels(*labels).set(row.lag)
            current.add(labels)
        for labels in self._exported - current:
            with contextlib.suppress(KeyError):
                CONSUMER_LAG.remove(*labels)
        self._exported = current
        return rows

    def close(self) -> None:
        """Close the reader's clients and drop this worker's series."""
        for labels in self._exported:
            with contextlib.suppress(KeyError):
                CONSUMER_LAG.remove(*labels)
        self._exported = set()
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def recovery_remaining(app: Any) -> int | None:
    """Changelog records the worker's table recovery still has to read, faust's and the
    project's restores together (``None``: not recovering)."""
    restores = table_recovery(app)
    restoring = sum(t.remaining for t in restores.progress()) if restores is not None else 0
    try:
        manager = app.tables
        if not manager.recovery.in_recovery:
            return restoring or None
        return int(manager.recovery.active_remaining_total()) + restoring
    except Exception:  # no tables (yet): nothing to recover
        return restoring or None


def lag_export_service(
    exporter: WorkerLagExporter, interval_s: float, watchdog: StallWatchdog | None = None, app: Any = None
) -> type[Any]:
    """A mode Service class (``app.service`` instantiates it) running ``exporter`` periodically,
    and the stall ``watchdog`` on its readings (logging ``app``'s consumer view on a stall)."""

    recovery = RecoveryWatch(watchdog.stall_s) if watchdog is not None and app is not None else None

    class WorkerLagExportService(Service):
        """Exports this worker's consumer lag every ``interval_s`` seconds."""

        @Service.task
        async def _export(self) -> None:
            while not self.should_stop:
                rows = await exporter.export_once()
                if watchdog is not None and rows:
                    stalled = watchdog.observe(rows, time.monotonic())
                    if stalled:
                        view = offsets_view(app, stalled) if app is not None else ""
                        exit_stalled(exporter.group_id, stalled, watchdog.stall_s, rows, view)
                if recovery is not None:
                    remaining = recovery_remaining(app)
                    if recovery.observe(remaining, time.monotonic()):
                        exit_recovery_stalled(exporter.group_id, remaining or 0, recovery.stall_s)
                await self.sleep(interval_s)

        async def on_stop(self) -> None:
            await asyncio.to_thread(exporter.close)

    return WorkerLagExportService
