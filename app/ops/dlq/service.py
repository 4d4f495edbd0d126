"""The ops group's DLQ service: reads the DLQ and its state into the :class:`DlqStore`, alerts, re-injects.

:class:`DlqService` assigns itself every partition of ``topic.system.dlq`` and of
``topic.system.dlq.state`` (manual assignment from the store's positions, no group rebalancing):
it indexes each dead letter and applies each operator change in log order, so every ops replica
holds the same view, and operator actions are committed through a
:class:`app.ops.dlq.journal.KafkaJournal` on the state topic. New arrivals increment
``avcc_dlq_indexed_total``, log one structured line and raise the P2 alert ``AvccDeadLetter``
through :mod:`app.ops.alerts` (de-duplicated per group and error class). It also owns the core
producer the store re-injects with.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from app.ops.alerts import AlertDispatcher, dead_letter_alert, dispatcher_from_settings
from app.ops.dlq.entries import DlqError
from app.ops.dlq.journal import KafkaJournal
from app.ops.dlq.state import StateChange
from app.ops.dlq.store import DlqStore
from app.platform.faust.own_consumer import OwnConsumerService
from app.platform.faust.runtime import now_ms
from app.platform.kafka.admin import ensure_state_topic
from app.platform.kafka.clients import consumer_config, verified_producer
from app.platform.kafka.consumer_loop import ConsumerLoop
from app.platform.kafka.producers import EventProducer
from app.platform.metrics import DLQ_INDEXED
from app.platform.settings import Settings, get_settings
from app.platform.topics import DLQ, DLQ_STATE

__all__ = [
    "DLQ_CONSUMER_GROUP",
    "DLQ_STORE_DIR",
    "DlqPartitions",
    "DlqService",
    "dlq_store_path",
    "install_dlq",
]

log = logging.getLogger(__name__)


#: Directory of the DLQ store under the data dir.
DLQ_STORE_DIR: Final = "dlq"
#: Consumer group whose commits mirror the DLQ store's positions (for lag monitoring only).
DLQ_CONSUMER_GROUP: Final = "avcc-ops-dlq"


def dlq_store_path(settings: Settings) -> Path:
    """Where the DLQ store lives: ``<data dir>/dlq`` (created on demand)."""
    return settings.resolve_data_path(DLQ_STORE_DIR)


Position = tuple[str, int]


class DlqPartitions(ConsumerLoop):
    """The DLQ indexer's consumer: every partition of its topics (DLQ, state), assigned by hand.

    It never subscribes (no group rebalancing: every ops replica reads everything, from its store's
    own positions); its group id only names where those positions are mirrored for lag monitoring.
    """

    def open(self) -> Consumer:
        """Create the consumer without subscribing; :meth:`assign_from` gives it its partitions."""
        consumer = self.consumer = Consumer(self.config)
        return consumer

    def assign_from(self, partitions: set[Position], offsets: dict[Position, int]) -> None:
        """Read ``partitions``, each from its next offset in ``offsets`` (else from the beginning)."""
        assert self.consumer is not None
        self.consumer.assign(
            [TopicPartition(t, p, offsets.get((t, p), OFFSET_BEGINNING)) for t, p in sorted(partitions)]
        )
        self.assigned.clear()
        self.assigned.update(partitions)


class DlqService:
    """The ops group's DLQ indexer: reads every DLQ and state partition into a :class:`DlqStore`,
    alerts on new arrivals, and owns the core producer used for re-injection and state changes.

    Any number of ops replicas may run: each rebuilds the same view from the two topics (see
    :mod:`tables.ops`).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        store_path: Path | None = None,
        topic: str = DLQ.name,
        state_topic: str = DLQ_STATE.name,
        group_id: str = DLQ_CONSUMER_GROUP,
        dispatcher: AlertDispatcher | None = None,
        console_url: str | None = None,
        alert_max_age_s: float = 3600.0,
    ) -> None:
        self.settings = settings or get_settings()
        self.store_path = store_path
        self.topic = topic
        self.state_topic = state_topic
        self.group_id = group_id
        self.console_url = console_url
        self.alert_max_age_s = alert_max_age_s
        self._dispatcher = dispatcher
        self._store: DlqStore | None = None
        self._producer: EventProducer | None = None
        self.partitions = DlqPartitions(
            consumer_config(self.settings, group_id, "avcc-ops-dlq", auto_offset_reset="earliest"),
            [topic, state_topic],
        )
        self._next_assign_check = 0.0
        #: End offsets at the first assignment; the view is complete once the store reached them.
        self._catch_up: dict[Position, int] | None = None
        self.caught_up = False
        self._pending: set[asyncio.Task[Any]] = set()
        self._stopping = threading.Event()
        self.indexed = 0

    @property
    def store(self) -> DlqStore:
        """The open store (:class:`DlqError` before the service started)."""
        if self._store is None:
            raise DlqError("the DLQ store is not open yet (ops worker starting)")
        return self._store

    @property
    def ready(self) -> bool:
        """True once the store is open and the producer exists."""
        return self._store is not None and self._store.sender is not None

    async def serve(self) -> None:
        """Open the store, the producer and the consumer; index until :meth:`stop`; then close
        them."""
        await self._open()
        try:
            await self._consume()
        finally:
            await self._shut()

    def stop(self) -> None:
        """Ask :meth:`serve` to return after the current poll (from any thread)."""
        self._stopping.set()

    def assignment(self) -> list[tuple[str, int]]:
        """Every DLQ and state partition the indexer reads."""
        return sorted(self.partitions.assigned)

    async def _open(self) -> None:
        """Open the store, create the producer and the consumer."""
        path = self.store_path or dlq_store_path(self.settings)
        self._store = DlqStore(path)
        if self._dispatcher is None:
            self._dispatcher = dispatcher_from_settings(self.settings)
        await self.partitions.call(self.partitions.open)
        loop = asyncio.get_running_loop()
        try:
            state_topic = replace(DLQ_STATE, name=self.state_topic)
            await loop.run_in_executor(None, ensure_state_topic, self.settings, state_topic)
        except Exception as exc:  # broker not there yet: the assignment loop waits for the topic
            log.warning("could not ensure the DLQ state topic %s: %r", self.state_topic, exc)
        self._producer = await loop.run_in_executor(
            None, verified_producer, self.settings, "core", "avcc-ops-dlq"
        )
        self._store.sender = self._producer
        self._store.journal = KafkaJournal(
            self._store, self._producer, self.state_topic, DLQ_STATE.partitions, self._end_offset
        )
        log.info("DLQ store open at %s (%s)", path, self._store.counts())

    async def _consume(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._ensure_assignment()
                consumer = self.partitions.consumer
                if consumer is None or not self.partitions.assigned:
                    await asyncio.sleep(1.0)
                    continue
                # a short poll: operator actions wait for this loop to apply their own change
                messages = await self.partitions.call(consumer.consume, 200, 0.1)
                for message in messages:
                    await self._handle(message)
                if messages:
                    await self._commit()
                self._check_caught_up()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep indexing after transient broker errors
                log.exception("DLQ consumer loop error: %r", exc)
                await asyncio.sleep(1.0)

    async def _ensure_assignment(self) -> None:
        now = time.monotonic()
        if now < self._next_assign_check:
            return
        self._next_assign_check = now + 30.0
        consumer = self.partitions.consumer
        assert consumer is not None
        partitions: set[Position] = set()
        for topic in (self.topic, self.state_topic):
            meta = await self.partitions.call(consumer.list_topics, topic, 10.0)
            topic_meta = meta.topics.get(topic)
            if topic_meta is None or topic_meta.error is not None or not topic_meta.partitions:
                log.warning("DLQ topic %s not available yet; retrying", topic)
                self._next_assign_check = now + 2.0
                return
            partitions.update((topic, p) for p in topic_meta.partitions)
        if partitions == self.partitions.assigned:
            return
        offsets = self._positions()
        await self.partitions.call(self.partitions.assign_from, partitions, offsets)
        log.info("DLQ indexer reading %s from %s", sorted(partitions), offsets)
        if self._catch_up is None:
            self._catch_up = await self.partitions.call(self._end_offsets, partitions)

    def _end_offsets(self, partitions: set[Position]) -> dict[Position, int]:
        """End offsets of ``partitions`` (on the consumer's thread)."""
        consumer = self.partitions.consumer
        assert consumer is not None
        return {
            (t, p): int(consumer.get_watermark_offsets(TopicPartition(t, p), 10.0)[1]) for t, p in partitions
        }

    def _check_caught_up(self) -> None:
        if self.caught_up or self._catch_up is None:
            return
        positions = self._positions()
        if all(positions.get(tp, 0) >= end for tp, end in self._catch_up.items()):
            self.caught_up = True
            log.info("DLQ view complete: dead letters and operator state read up to %s", self._catch_up)

    def readiness(self) -> tuple[bool, str]:
        """The ops worker's ``/ready`` condition: the view holds every dead letter and operator
        change that existed when this replica started (a rebuilt store is not served half-read)."""
        if not self.ready:
            return False, "DLQ store opening"
        if not self.caught_up:
            return False, "reading the dead letters and their operator state"
        return True, ""

    def _positions(self) -> dict[Position, int]:
        """The store's next offsets of both topics."""
        return {
            **{(self.topic, p): o for p, o in self.store.next_offsets().items()},
            **{(self.state_topic, p): o for p, o in self.store.state_offsets().items()},
        }

    async def _end_offset(self, partition: int) -> int:
        """The end offset of a state-topic partition (what :meth:`KafkaJournal.sync` waits for)."""
        consumer = self.partitions.consumer
        if consumer is None:
            raise DlqError("the DLQ store is not open yet (ops worker starting)")
        _, high = await self.partitions.call(
            consumer.get_watermark_offsets, TopicPartition(self.state_topic, partition), 10.0
        )
        return int(high)

    async def _commit(self) -> None:
        """Mirror the store's positions into Kafka (group ``avcc-ops-dlq``) for lag monitoring."""
        consumer = self.partitions.consumer
        if consumer is None:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._positions().items()]
        if offsets:
            await self.partitions.call(functools.partial(consumer.commit, offsets=offsets, asynchronous=True))

    async def _handle(self, message: Any) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("DLQ consumer error: %s", error)
            return
        if message.topic() == self.state_topic:
            self._apply(message)
            return
        _, timestamp = message.timestamp()
        entry, new = self.store.index(
            message.partition(),
            message.offset(),
            int(timestamp or 0),
            message.key(),
            message.value(),
            message.headers(),
        )
        if not new:
            return
        self.indexed += 1
        DLQ_INDEXED.labels(entry.consumer_group, entry.original_topic, entry.error_class).inc()
        meta = entry.metadata
        log.error(
            "dlq.new dlq_id=%s group=%s topic=%s partition=%s offset=%s event_id=%s attempt=%s "
            "error_class=%s error=%s",
            entry.dlq_id,
            entry.consumer_group,
            entry.original_topic,
            meta.original_partition if meta else None,
            meta.original_offset if meta else None,
            entry.event_id,
            meta.attempt if meta else None,
            entry.error_class,
            (meta.error_message if meta else entry.metadata_error or "")[:300],
        )
        if now_ms() - entry.failed_at_ms > self.alert_max_age_s * 1000:
            return  # re-indexing history (new store): no alert storm for old dead letters
        assert self._dispatcher is not None
        alert = dead_letter_alert(
            group=entry.consumer_group or "unknown",
            error_class=entry.error_class,
            topic=entry.original_topic or "unknown",
            dlq_id=entry.dlq_id,
            error_message=meta.error_message if meta else entry.metadata_error or "",
            event_id=entry.event_id,
            console_url=self.console_url,
        )
        task = asyncio.ensure_future(self._dispatcher.dispatch(alert))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _apply(self, message: Any) -> None:
        position = (message.partition(), message.offset())
        try:
            change = StateChange.from_json(message.value() or b"")
        except (ValueError, KeyError, TypeError) as exc:
            log.error("DLQ state record %s@%s unreadable, skipped: %r", self.state_topic, position, exc)
            self.store.skip_state(*position)
            return
        if not self.store.apply(change, position):
            log.info("DLQ state change %s refused: a concurrent one came first", change.change_id)

    async def _shut(self) -> None:
        """Close consumer (after the last poll), alert sinks, producer and store."""
        if self._pending:
            await asyncio.wait(self._pending, timeout=5.0)
        if self.partitions.consumer is not None:
            await self.partitions.call(self.partitions.close)
        self.partitions.shutdown_thread()
        if self._dispatcher is not None:
            await self._dispatcher.close()
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await asyncio.get_running_loop().run_in_executor(None, producer.close)
        if self._store is not None:
            store, self._store = self._store, None
            store.close()


def install_dlq(app: Any, settings: Settings | None = None, **kwargs: Any) -> DlqService:
    """Create the :class:`DlqService` of ``app`` (once) and run it with the app's worker, as its
    own consumer (:class:`~app.platform.faust.own_consumer.OwnConsumerService`)."""
    existing = getattr(app, "_avcc_dlq_service", None)
    if isinstance(existing, DlqService):
        return existing
    service = DlqService(settings or get_settings(), **kwargs)
    app.service(OwnConsumerService(lambda: service))
    app._avcc_dlq_service = service
    return service
