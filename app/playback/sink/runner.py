"""A running sink: its ClickHouse connections, DLQ producer, :class:`SinkLoop` and thread."""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable

from app.platform.faust.app import consumer_group_id
from app.platform.gc_tuning import raise_gen0_threshold
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
        self.on_crash: Callable[[BaseException], None] | None = None

    def start(self) -> None:
        """Start the loop thread (and raise the process's gen-0 GC threshold, see the config)."""
        raise_gen0_threshold(self.config.gc_gen0_threshold)
        self._thread = threading.Thread(target=self._run, name="clickhouse-sink", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.loop.run(self._stop)
        except BaseException as exc:
            self.error = exc
            log.critical("sink loop crashed: %s\n%s", exc, traceback.format_exc())
            if self.on_crash is not None:
                self.on_crash(exc)

    @property
    def running(self) -> bool:
        """Whether the loop thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def readiness(self) -> tuple[bool, str]:
        """``(ready, why not)``: running, and not paused by failing ClickHouse writes."""
        if not self.running:
            return False, "the sink loop is not running"
        if self.loop.stats.paused:
            return False, "ClickHouse writes are failing: partitions paused, retrying"
        return True, ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the loop (stores the current batch if it can), flush the DLQ producer, close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("sink thread did not stop within %.0fs", timeout_s)
        self._dlq.close()
        if self.query_backend is not self.backend:
            self.query_backend.close()
        self.backend.close()
