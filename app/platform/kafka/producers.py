"""Producer profiles of seed 9.3.1 and an asyncio wrapper around the confluent-kafka producer.

The core profile (``acks=all``, idempotence, unbounded retries within a delivery timeout) is
used for every core-topic, retry and DLQ message; the playback profile (``acks=1``,
``linger.ms=5``, 64 KiB batches) for the firehose. confluent-kafka is used for both: it
partitions with Java-compatible murmur2 in C, and it is ~8x faster than aiokafka.

The playback profile's sends are never awaited, so librdkafka reports only its failed
deliveries (:data:`REPORTING`): each is counted in ``avcc_producer_delivery_failures_total``
and logged, at most one line per :data:`FAILURE_LOG_INTERVAL_S`, instead of a report crossing
into Python for every event.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from app.platform.errors import BrokerCapabilityError, DependencyUnavailable
from app.platform.metrics import PRODUCER_DELIVERY_FAILURES
from app.platform.settings import Settings
from app.platform.topics import ProducerProfile, TopicSpec

__all__ = [
    "PROFILES",
    "REPORTING",
    "Delivery",
    "EventProducer",
    "Headers",
    "Outbound",
    "profile_config",
]

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]

#: Seconds between two log lines about failed deliveries of an unacknowledged profile.
FAILURE_LOG_INTERVAL_S = 10.0

#: librdkafka's spelling of Java's Integer.MAX_VALUE retries.
_UNBOUNDED_RETRIES = 2_147_483_647

#: The two producer profiles of seed 9.3.1, in librdkafka configuration names.
PROFILES: Mapping[ProducerProfile, Mapping[str, str | int | bool]] = {
    "core": {
        "acks": "all",
        "enable.idempotence": True,
        "retries": _UNBOUNDED_RETRIES,
        "delivery.timeout.ms": 120_000,
        "max.in.flight.requests.per.connection": 5,
        "linger.ms": 1,
        "partitioner": "murmur2_random",
    },
    "playback": {
        "acks": 1,
        "enable.idempotence": False,
        "linger.ms": 5,
        "batch.size": 64 * 1024,
        "partitioner": "murmur2_random",
        "queue.buffering.max.kbytes": 64 * 1024,
        "queue.buffering.max.messages": 200_000,
    },
}
#: How each profile's deliveries are reported back to the process (client-side only, so not
#: part of the published profile): playback sends are never awaited, only failures are reported.
REPORTING: Mapping[ProducerProfile, Mapping[str, str | int | bool]] = {
    "core": {},
    "playback": {"delivery.report.only.error": True},
}


def profile_config(settings: Settings, profile: ProducerProfile) -> dict[str, Any]:
    """Full client configuration of ``profile``: connection/security settings plus the profile."""
    conf: dict[str, Any] = settings.kafka_client_config()
    conf.update(PROFILES[profile])
    conf.update(REPORTING[profile])
    conf["statistics.interval.ms"] = 1000 if profile == "core" else 0
    return conf


class Outbound(NamedTuple):
    """One message to produce: topic, value (``None``: a tombstone), key, headers, partition
    (``None``: murmur2 of the key)."""

    topic: TopicSpec | str
    value: bytes | None
    key: bytes | None
    headers: Headers | None = None
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where the broker stored a produced message."""

    topic: str
    partition: int
    offset: int


class EventProducer:
    """An asyncio-friendly confluent-kafka producer bound to one profile.

    A daemon thread serves delivery callbacks; :meth:`send` resolves once the broker
    acknowledged (so a consumer may commit its input after it), :meth:`send_nowait` only
    enqueues (the playback path, where the profile accepts rare loss).
    """

    def __init__(self, settings: Settings, profile: ProducerProfile, client_id: str = "avcc") -> None:
        self.profile: ProducerProfile = profile
        self.config: dict[str, Any] = profile_config(settings, profile)
        self.config["client.id"] = f"{client_id}-{profile}"
        self._dev_mode = settings.dev_mode
        self._stats: dict[str, Any] = {}
        self._stats_event = threading.Event()
        #: Whether every delivery is reported (``send`` can wait); else only failures are.
        self.acknowledges = not self.config.get("delivery.report.only.error", False)
        self._failures_unlogged = 0
        self._failure_logged_at = float("-inf")
        conf = dict(self.config)
        if conf["statistics.interval.ms"]:
            conf["stats_cb"] = self._on_stats
        if not self.acknowledges:
            conf["on_delivery"] = self._on_failed_delivery
        self._producer = Producer(conf)
        self._running = True
        self._poller = threading.Thread(target=self._poll_loop, name=f"producer-{profile}", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        while self._running:
            self._producer.poll(0.05)

    def _on_stats(self, raw: str) -> None:
        self._stats = orjson.loads(raw)
        self._stats_event.set()

    def _on_failed_delivery(self, err: KafkaError | None, msg: Message) -> None:
        """Default report of an unacknowledged profile (librdkafka sends only failures)."""
        if err is None:
            return
        topic = str(msg.topic())
        PRODUCER_DELIVERY_FAILURES.labels(self.profile, topic).inc()
        self._failures_unlogged += 1
        now = time.monotonic()
        if now - self._failure_logged_at >= FAILURE_LOG_INTERVAL_S:
            log.error(
                "%d %s message(s) not delivered; latest to %s: %s",
                self._failures_unlogged,
                self.profile,
                topic,
                err.str(),
            )
            self._failures_unlogged = 0
            self._failure_logged_at = now

    @property
    def stats(self) -> dict[str, Any]:
        """The latest librdkafka statistics (core profile only)."""
        return self._stats

    def idempotence_state(self, timeout_s: float = 10.0) -> str:
        """librdkafka's idempotent-producer state (``Assigned`` once the broker gave a PID), or
        ``no answer: <error>`` when the broker never answered a metadata request in ``timeout_s``.

        A metadata request that times out is asked again until the deadline: the first one of a
        TLS + SASL client on a busy box can take seconds (the handshake and the SCRAM exchange).
        """
        deadline = time.monotonic() + timeout_s
        unanswered: KafkaException | None = None
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                self._producer.list_topics(timeout=min(2.0, remaining))
            except KafkaException as exc:
                unanswered = exc
                continue
            unanswered = None
            state = str(self._stats.get("eos", {}).get("idemp_state", ""))
            if state == "Assigned":
                return state
            self._stats_event.clear()
            self._stats_event.wait(0.5)
        if unanswered is not None:
            return f"no answer: {unanswered.args[0].str() if unanswered.args else unanswered}"
        return str(self._stats.get("eos", {}).get("idemp_state", "unknown"))

    def verify_profile(self, timeout_s: float = 15.0) -> None:
        """Check the broker honours this profile; refuse (outside dev mode) if it does not."""
        if not self.config.get("enable.idempotence"):
            return
        state = self.idempotence_state(timeout_s)
        if state != "Assigned":
            message = (
                f"broker {self.config['bootstrap.servers']} did not grant an idempotent producer id "
                f"(state {state!r}): the core profile (acks=all + idempotence) cannot be honoured"
            )
            if not self._dev_mode:
                raise BrokerCapabilityError(message)
            log.warning("DEV MODE: %s", message)

    async def send(
        self,
        topic: TopicSpec | str,
        value: bytes,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> Delivery:
        """Produce one message and wait for the broker's acknowledgement.

        Refused (``TypeError``) on a profile that reports failures only: nothing would answer.
        """
        if not self.acknowledges:
            raise TypeError(f"the {self.profile} profile does not acknowledge sends: use send_nowait")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Delivery] = loop.create_future()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                exc: Exception = DependencyUnavailable(f"produce to {msg.topic()} failed: {err.str()}")
                loop.call_soon_threadsafe(_settle_error, future, exc)
            else:
                delivery = Delivery(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
                loop.call_soon_threadsafe(_settle, future, delivery)

        self._produce(topic, value, key, headers, partition, on_delivery)
        return await future

    async def send_many(
        self, messages: Sequence[tuple[TopicSpec | str, bytes, bytes | None, Headers | None]]
    ) -> list[Delivery]:
        """Produce several messages and wait until all are acknowledged (order kept per key)."""
        return await self.send_batch([Outbound(t, v, k, h) for t, v, k, h in messages])

    async def send_batch(self, messages: Sequence[Outbound]) -> list[Delivery]:
        """Produce ``messages`` in order and wait once until every one is acknowledged; their
        deliveries in the same order. Raises ``DependencyUnavailable`` (once all have settled)
        if the broker refused any: the caller sends the batch again (event ids are
        deterministic, so the duplicates are dropped downstream)."""
        if not self.acknowledges:
            raise TypeError(f"the {self.profile} profile does not acknowledge sends: use send_nowait")
        if not messages:
            return []
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        settled = _BatchDeliveries(len(messages), loop, done)
        for index, (topic, value, key, headers, partition) in enumerate(messages):
            self._produce(topic, value, key, headers, partition, settled.callback(index))
        await done
        if settled.errors:
            raise DependencyUnavailable(
                f"{len(settled.errors)} of {len(messages)} messages refused: {settled.errors[0]}"
            )
        return settled.deliveries  # type: ignore[return-value]

    def send_nowait(self, topic: TopicSpec | str, value: bytes, key: bytes | None = None) -> None:
        """Enqueue without waiting; raises ``BufferError`` when the local queue is full."""
        name = _topic_name(topic)
        self._producer.produce(name, value, key)

    def send_many_nowait(self, topic: TopicSpec | str, values: Sequence[bytes], keys: Sequence[bytes]) -> int:
        """Enqueue ``values`` (with ``keys``) in order until the local queue is full or the client
        refuses one; returns how many were enqueued (the rest were not, and may be sent again)."""
        name = _topic_name(topic)
        produce = self._producer.produce
        sent = 0
        try:
            for value, key in zip(values, keys, strict=True):
                produce(name, value, key)
                sent += 1
        except BufferError:
            pass
        except KafkaException as exc:
            log.error("produce to %s failed: %s", name, exc)
        return sent

    def _produce(
        self,
        topic: TopicSpec | str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers | None,
        partition: int | None,
        callback: Any,
    ) -> None:
        name = _topic_name(topic)
        kwargs: dict[str, Any] = {"on_delivery": callback}
        if headers:
            kwargs["headers"] = list(headers)
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(name, value, key, **kwargs)
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                raise DependencyUnavailable(f"produce to {name} failed: {exc}") from exc

    def queue_length(self) -> int:
        """Messages waiting in the local queue (for backpressure decisions)."""
        return len(self._producer)

    def flush(self, timeout_s: float = 30.0) -> int:
        """Block until queued messages are delivered; returns how many are still queued."""
        return int(self._producer.flush(timeout_s))

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush and stop the delivery thread."""
        remaining = self.flush(timeout_s)
        if remaining:
            log.error("%d %s messages undelivered at close", remaining, self.profile)
        self._running = False
        self._poller.join(timeout=5)
        del self._producer  # releases librdkafka's connections now, not at garbage collection


class _BatchDeliveries:
    """Collects the delivery reports of one batch (from librdkafka's polling threads) and
    settles ``done`` on the event loop once, when the last one arrived."""

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:
        self.deliveries: list[Delivery | None] = [None] * count
        self.errors: list[str] = []
        self._remaining = count
        self._lock = threading.Lock()
        self._loop = loop
        self._done = done

    def callback(self, index: int) -> Any:
        """The delivery callback of message ``index``."""

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            with self._lock:
                if err is not None:
                    self.errors.append(f"{msg.topic()}: {err.str()}")
                else:
                    self.deliveries[index] = Delivery(
                        str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)
                    )
                self._remaining -= 1
                last = self._remaining == 0
            if last:
                self._loop.call_soon_threadsafe(_settle_done, self._done)

        return on_delivery


def _settle_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _topic_name(topic: TopicSpec | str) -> str:
    return topic if isinstance(topic, str) else topic.name


def _settle(future: asyncio.Future[Delivery], delivery: Delivery) -> None:
    if not future.done():
        future.set_result(delivery)


def _settle_error(future: asyncio.Future[Delivery], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
