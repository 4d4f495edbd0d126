"""A running sink: its ClickHouse connections, DLQ producer and :class:`SinkLoop`, run on a thread of
its own (an own consumer of the sink group: :mod:`app.platform.faust.own_consumer`)."""

from __future__ import annotations

import logging
import threading
import traceback

from app.platform.faust.app import consumer_group_id
from app.platform.gc_tuning import raise_gen0_threshold
from app.platform.kafka.consumer_loop import in_thread
from app.platform.settings import Settings
from app.playback.sink.batch import GROUP, SinkTopics
from app.playback.sink.clickhouse import ChdbBackend, ClickHouseBackend, connect
from app.playback.sink.dlq import DeadLetterProducer
from app.playback.sink.loop import SinkLoop
from app.playback.sink.settings import SinkSettings, get_sink_settings

__all__ = ["SinkRunner"]

log = logging.getLogger(__name__)


class SinkRunner:
    """Owns a sink's ClickHouse backends, DLQ producer, :class:`SinkLoop` and its thread."""

    def __init__(
        self,
        settings: Settings,
        *,
        config: SinkSettings | None = None,
        topics: SinkTopics | None = None,
        group_id: str | None = None,
        clickhouse_url: str | None = None,
    ) -> None:
        self.settings = settings
        self.config = config if config is not None else get_sink_settings()
        self.topics = topics if topics is not None else SinkTopics()
        self.group_id = group_id or consumer_group_id(GROUP)
        self.clickhouse_url = clickhouse_url or settings.clickhouse_url
        cluster = settings.clickhouse_cluster
        self.backend = connect(self.clickhouse_url, settings.data_dir, cluster)
        # Web queries get their own server connection (they never wait behind a 50k-row
        # insert); chDB is in-process and thread-safe: share it.
        self.query_backend: ClickHouseBackend = (
            self.backend
            if isinstance(self.backend, ChdbBackend)
            else connect(self.clickhouse_url, settings.data_dir, cluster)
        )
        self._dlq = DeadLetterProducer(settings, self.config.dlq_timeout_s)
        self.loop = SinkLoop(
            settings, self.backend, self._dlq, config=self.config, topics=self.topics, group_id=self.group_id
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._running = False

    def run(self) -> None:
        """Consume until :meth:`stop` (blocking: call it on the sink's own thread), then flush the
        DLQ producer and close the ClickHouse connections. Raises what crashed the loop."""
        raise_gen0_threshold(self.config.gc_gen0_threshold)
        self._running = True
        try:
            self.loop.run(self._stop)
        except BaseException as exc:
            self.error = exc
            log.critical("sink loop crashed: %s\n%s", exc, traceback.format_exc())
            raise
        finally:
            self._running = False
            self._release()

    async def serve(self) -> None:
        """:meth:`run` on a thread of its own, for the worker's own-consumer service."""
        await in_thread(self.run, "clickhouse-sink")

    def start(self) -> None:
        """:meth:`run` on a thread of its own, for a caller without an event loop (tests, bench)."""
        self._thread = threading.Thread(target=self.run, name="clickhouse-sink", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the loop runs."""
        return self._running

    def assignment(self) -> list[tuple[str, int]]:
        """``(topic, partition)`` pairs the sink's consumer owns."""
        return self.loop.assignment()

    def readiness(self) -> tuple[bool, str]:
        """``(ready, why not)``: running, and not paused by failing ClickHouse writes."""
        if not self.running:
            return False, "the sink loop is not running"
        if self.loop.stats.paused:
            return False, "ClickHouse writes are failing: partitions paused, retrying"
        return True, ""

    def stop(self) -> None:
        """Ask the loop to store its current batch if it can and return (from any thread)."""
        self._stop.set()

    def close(self, timeout_s: float = 30.0) -> None:
        """:meth:`stop`, then wait for the thread :meth:`start` began (at most ``timeout_s``)."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("sink thread did not stop within %.0fs", timeout_s)

    def _release(self) -> None:
        """Flush the DLQ producer and close the ClickHouse connections (the loop has returned)."""
        self._dlq.close()
        if self.query_backend is not self.backend:
            self.query_backend.close()
        self.backend.close()
