"""Where signed requests' nonces are recorded: one process, or every replica through Kafka.

A captured request must be accepted at most once in the whole deployment within the skew
window, whichever replica receives it. :class:`NonceLedger` makes the claim of a nonce a
message on ``topic.system.nonces``, keyed by key id and nonce so that every claim of one nonce
lands in one partition. Every replica reads every partition of that topic and runs the same
per-key :class:`NonceCache` over it, so all replicas reach the same verdict for a claim: the
first in log order wins, a later one is a replay. A replica answers its request once its own
consumer has read its own claim back.

Cost per signed request: one produce with ``acks=all`` (idempotent) and the wait until the
replica's consumer reads the claim back, a few milliseconds on loopback (measured in
``tests/integration/test_nonce_ledger.py``); memory: one cache entry per live nonce of the
deployment (``2 x hmac_max_skew_ms``), bounded per key.

:class:`LocalNonces` keeps the same cache in one process (``AVCC_NONCE_STORE=local``): enough
for a single worker, and what unit tests use.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from app.platform.errors import DependencyUnavailable
from app.platform.http.signing import AuthFailureReason, NonceCache
from app.platform.kafka.clients import consumer_config
from app.platform.kafka.producers import EventProducer
from app.platform.settings import Settings
from app.platform.topics import NONCES

__all__ = ["NONCE_READER_GROUP", "LocalNonces", "NonceLedger", "NonceStore", "nonce_store"]

log = logging.getLogger(__name__)

#: Longest wait for a claim's acknowledgement and read-back before the request gets a 503.
CLAIM_TIMEOUT_S: Final = 5.0
#: The client id of the ledger's clients, and (suffixed) its reader's group id: the reader assigns
#: every partition and never commits, so the group id only satisfies the client.
NONCE_CLIENT_ID: Final = "avcc-nonces"
NONCE_READER_GROUP: Final = f"{NONCE_CLIENT_ID}-reader"
#: Quiet time (no claim of this process pending, nothing read) after which the reader pauses
#: its partitions: it fetches with a 10 ms wait, about 100 fetches a second, which kept the
#: embedded broker (answering only when a fetch's wait expires) busy while nobody was signing.
READER_IDLE_AFTER_S: Final = 1.0
#: How long a paused reader sleeps before it reads the others' claims again (a claim of this
#: process wakes it at once). Verdicts do not depend on it: a claim is judged when it is read
#: back, after every earlier claim of its partition; it bounds the backlog read on a wake-up.
READER_IDLE_POLL_S: Final = 1.0


class NonceStore(Protocol):
    """Records a verified request's nonce; the refusal reason when it may not be used."""

    async def claim(self, key: str, nonce: str, timestamp_ms: int, now_ms: int) -> AuthFailureReason | None:
        """``None``: first use, go ahead; otherwise why the request is refused."""
        ...


class LocalNonces:
    """The nonces of this process only."""

    def __init__(self, cache: NonceCache) -> None:
        self.cache = cache

    async def claim(self, key: str, nonce: str, timestamp_ms: int, now_ms: int) -> AuthFailureReason | None:
        """Check and record in the process-wide cache."""
        return self.cache.check_and_add(key, nonce, timestamp_ms, now_ms)


def _claim_key(key: str, nonce: str) -> bytes:
    # Key ids and nonces are printable ASCII without newlines (checked before any claim).
    return f"{key}\n{nonce}".encode()


class NonceLedger:
    """Nonce claims shared by every replica through ``topic.system.nonces`` (see module doc)."""

    def __init__(
        self, settings: Settings, *, topic: str = NONCES.name, client_id: str = NONCE_CLIENT_ID
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.client_id = client_id
        self.cache = NonceCache(2 * settings.hmac_max_skew_ms)
        self._lock = threading.Lock()
        #: Pairs this process has claimed and not yet heard back.
        self._pending: set[tuple[str, str]] = set()
        #: (partition, offset) of a claim of this process -> callback with its verdict.
        self._waiting: dict[tuple[int, int], Callable[[AuthFailureReason | None], None]] = {}
        #: Verdicts on our own claims read back before their delivery report arrived.
        self._verdicts: dict[tuple[int, int], AuthFailureReason | None] = {}
        self._producer: EventProducer | None = None
        self._reader: threading.Thread | None = None
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        #: Set when this process claims a nonce: wakes a paused reader.
        self._wake = threading.Event()
        #: Times the reader paused for being idle (tests, logs).
        self.idle_pauses = 0
        #: Set when a claim of this process was acknowledged by the broker but not read back in
        #: time: the reader replaces its consumer. librdkafka can leave an assigned partition
        #: unfetched after a broker restart (its issues #5153, #5591: no error, no message);
        #: seen here as every claim of a replica timing out after the broker came back.
        self._renew = threading.Event()
        #: Times the reader's consumer was replaced (tests, logs).
        self.renewals = 0
        #: partition -> next offset to read, kept across the reader's consumers so a new one
        #: resumes where the last one had read instead of reading the window again.
        self._next: dict[int, int] = {}
        #: When the reader's current consumer was assigned (monotonic): a claim sent before
        #: that says nothing about it.
        self._session_started = float("inf")
        self._start_lock = threading.Lock()

    @property
    def ready(self) -> bool:
        """True once the claims of the last window have been read (the verdicts are complete)."""
        return self._caught_up.is_set()

    def start(self) -> None:
        """Create the producer and start reading every partition (idempotent, thread-safe)."""
        with self._start_lock:
            if self._reader is not None:
                return
            self._producer = EventProducer(self.settings, "core", client_id=self.client_id)
            self._stop.clear()
            self._reader = threading.Thread(target=self._read, name=f"{self.client_id}-reader", daemon=True)
            self._reader.start()

    def stop(self) -> None:
        """Stop reading and flush the producer."""
        self._stop.set()
        self._wake.set()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.join(timeout=10)
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.close(5)

    async def claim(self, key: str, nonce: str, timestamp_ms: int, now_ms: int) -> AuthFailureReason | None:
        """Append a claim and wait for this replica's own verdict on it.

        A pair already seen (by any replica) is refused at once without a message. Raises
        ``DependencyUnavailable`` when the broker does not acknowledge or return the claim in
        time (the request is answered 503; its nonce may be burnt, the client signs again).
        """
        if timestamp_ms <= self.cache.floor_ms(key):
            return "stale_timestamp"
        if self.cache.contains(key, nonce, now_ms):
            return "replayed_nonce"
        self.start()
        producer = self._producer
        assert producer is not None
        loop = asyncio.get_running_loop()
        verdict: asyncio.Future[AuthFailureReason | None] = loop.create_future()
        pair, where, sent_at = (key, nonce), (-1, -1), time.monotonic()

        def settle(result: AuthFailureReason | None) -> None:
            loop.call_soon_threadsafe(_resolve, verdict, result)

        async def claimed() -> AuthFailureReason | None:
            nonlocal where
            delivery = await producer.send(self.topic, str(timestamp_ms).encode(), _claim_key(key, nonce))
            where = (delivery.partition, delivery.offset)
            with self._lock:
                if where in self._verdicts:  # read back before the acknowledgement arrived
                    return self._verdicts.pop(where)
                self._waiting[where] = settle
            return await verdict

        with self._lock:
            self._pending.add(pair)
        self._wake.set()
        try:
            return await asyncio.wait_for(claimed(), CLAIM_TIMEOUT_S)
        except TimeoutError:
            if where == (-1, -1):
                log.warning(
                    "nonce ledger: a claim was not acknowledged by the broker in %.0f s", CLAIM_TIMEOUT_S
                )
            elif sent_at >= self._session_started:
                self._renew_reader(where)
            raise DependencyUnavailable("nonce store (topic.system.nonces) did not answer in time") from None
        finally:
            with self._lock:
                self._pending.discard(pair)
                self._waiting.pop(where, None)

    def _renew_reader(self, where: tuple[int, int]) -> None:
        """Have the reader replace its consumer: a claim sent while it was assigned, and
        acknowledged by the broker at ``where`` (partition, offset), was not read back in time."""
        log.warning(
            "nonce ledger: claim at %s[%d]@%d acknowledged but not read back in %.0f s (reader at %s); "
            "replacing the reader's consumer",
            self.topic,
            where[0],
            where[1],
            CLAIM_TIMEOUT_S,
            self._next.get(where[0], "no offset yet"),
        )
        self._renew.set()
        self._wake.set()

    # -- the reader thread ----------------------------------------------------------------------
    def _read(self) -> None:
        """Read every partition until stopped; a failure (broker away, topic metadata not there
        yet) is logged and the reader starts over, so claims wait rather than fail for good; a
        renewal (:meth:`_renew_reader`) starts over at once with a new consumer."""
        while not self._stop.is_set():
            try:
                self._read_session()
            except Exception:
                log.exception("nonce ledger reader failed; starting over in 1 s")
                self._stop.wait(1.0)

    def _read_session(self) -> None:
        config = consumer_config(self.settings, f"{self.client_id}-reader", f"{self.client_id}-reader")
        config["fetch.wait.max.ms"] = 10  # a claim waits for its read-back: poll the log closely
        consumer = Consumer(config)
        try:
            positions = self._assign_window(consumer)
            self._session_started = time.monotonic()
            self._renew.clear()  # asked of an earlier consumer: this one is new
            assigned = [TopicPartition(self.topic, p) for p in positions]
            busy_until = time.monotonic() + READER_IDLE_AFTER_S
            while not self._stop.is_set():
                if self._renew.is_set():
                    self._renew.clear()
                    self.renewals += 1
                    return
                first = consumer.poll(0.05)  # returns on the first message, unlike consume()
                batch = [first, *consumer.consume(num_messages=499, timeout=0)] if first else []
                for msg in batch:
                    if msg.error() is None:
                        self._apply(msg)
                        start, end = positions[msg.partition()]
                        positions[msg.partition()] = (max(start, msg.offset() + 1), end)
                        self._next[msg.partition()] = positions[msg.partition()][0]
                if not self._caught_up.is_set() and all(pos >= end for pos, end in positions.values()):
                    self._caught_up.set()
                    log.info("nonce ledger caught up on %s", self.topic)
                if batch:
                    busy_until = time.monotonic() + READER_IDLE_AFTER_S
                elif self._caught_up.is_set() and time.monotonic() >= busy_until:
                    self._idle(consumer, assigned)
        finally:
            self._session_started = float("inf")
            consumer.close()

    def _idle(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        """Pause fetching until this process claims a nonce or :data:`READER_IDLE_POLL_S` passes
        (see :data:`READER_IDLE_AFTER_S`); returns at once while a claim is pending."""
        self._wake.clear()
        with self._lock:
            if self._pending:
                return
        consumer.pause(assigned)
        self.idle_pauses += 1
        try:
            self._wake.wait(READER_IDLE_POLL_S)
        finally:
            consumer.resume(assigned)

    def _assign_window(self, consumer: Consumer) -> dict[int, tuple[int, int]]:
        """Assign every partition from the start of the skew window, or from where an earlier
        consumer of this ledger had read; partition -> (next, end)."""
        metadata = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
        partitions = sorted(metadata.partitions) if metadata is not None and metadata.error is None else []
        if not partitions:  # not created yet (`avcc topics apply`, or the worker's own start)
            raise DependencyUnavailable(f"topic {self.topic} does not exist (yet)")
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
            for p in partitions
        }
        since = time.time_ns() // 1_000_000 - 2 * self.settings.hmac_max_skew_ms
        try:
            found = consumer.offsets_for_times(
                [TopicPartition(self.topic, p, since) for p in partitions], timeout=10
            )
            # -1: no claim of the window in that partition, start at its end
            starts = {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}
        except Exception:  # a broker without time lookups: read the (short-lived) topic whole
            starts = {p: OFFSET_BEGINNING for p in partitions}
        starts.update({p: offset for p, offset in self._next.items() if p in starts})
        consumer.assign([TopicPartition(self.topic, p, starts[p]) for p in partitions])
        return {p: (max(starts[p], 0), ends[p]) for p in partitions}

    def _apply(self, msg: Message) -> None:
        key, _, nonce = (msg.key() or b"").decode(errors="replace").partition("\n")
        try:
            timestamp = int(msg.value() or b"0")
        except ValueError:
            timestamp = 0
        result = self.cache.check_and_add(key, nonce, timestamp, time.time_ns() // 1_000_000)
        where = (msg.partition(), msg.offset())
        with self._lock:
            settle = self._waiting.pop(where, None)
            if settle is None and (key, nonce) in self._pending:
                self._verdicts[where] = result
        if settle is not None:
            settle(result)


def _resolve(future: asyncio.Future[AuthFailureReason | None], result: AuthFailureReason | None) -> None:
    if not future.done():
        future.set_result(result)


_stores: dict[tuple[str, str, int], NonceStore] = {}
_stores_lock = threading.Lock()


def nonce_store(settings: Settings) -> NonceStore:
    """The process-wide nonce store of ``settings`` (``AVCC_NONCE_STORE``), created on first use."""
    ident = (settings.nonce_store, settings.kafka_bootstrap, settings.hmac_max_skew_ms)
    with _stores_lock:
        store = _stores.get(ident)
        if store is None:
            if settings.nonce_store == "local":
                store = LocalNonces(NonceCache(2 * settings.hmac_max_skew_ms))
            else:
                store = NonceLedger(settings)
            _stores[ident] = store
        return store
