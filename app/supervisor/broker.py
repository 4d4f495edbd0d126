"""The dev stack's broker supervisor: the embedded Kafka broker, restarted with backoff on its data.

The broker keeps its log under the data dir, so a new broker process is the same broker: its
topics, committed offsets and table changelogs are all there, and the groups (whose clients
reconnect on their own) carry on where they were. A broker that exits is started again after the
delay its :class:`~app.supervisor.backoff.RestartTracker` gives, the same policy the groups get,
and each exit and each return is logged. A start that fails, or does not become ready within the
broker's ready timeout, counts as one more crash; only the time a broker served counts towards a
stable run (which starts the delays over).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from app.servers.kafka import KafkaKRaftBroker
from app.servers.process import ServerStartError
from app.supervisor.backoff import BackoffPolicy, RestartTracker
from app.supervisor.groups import describe_exit

__all__ = ["BrokerSupervisor"]

log = logging.getLogger("avcc.dev")

_TAIL_BYTES = 2000


class BrokerSupervisor:
    """Watches one started broker; call :meth:`tick` often (it never blocks for long)."""

    def __init__(
        self,
        broker: KafkaKRaftBroker,
        *,
        policy: BackoffPolicy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.broker = broker
        self.clock = clock
        self.tracker = RestartTracker(policy)
        self._started_at = clock()
        #: When the current run began to serve (``None`` while a restarted broker is not ready).
        self._serving_since: float | None = self._started_at
        self._restart_at: float | None = None

    @property
    def restarts(self) -> int:
        """Restarts so far (every exit schedules one)."""
        return self.tracker.total

    def tick(self) -> None:
        """Notice an exit (schedule a restart), start the broker when its delay is over, and say
        when a restarted broker answers again."""
        now = self.clock()
        if self._restart_at is not None:
            if now >= self._restart_at:
                self._launch(now)
            return
        if not self.broker.running:
            self._exited(now)
        elif self._serving_since is None:
            if self.broker.ready_now():
                self._serving_since = now
                log.info(
                    "embedded Kafka broker back on %s after %.1fs (restart #%d), on its data in %s",
                    self.broker.bootstrap,
                    now - self._started_at,
                    self.tracker.total,
                    self.broker.data_dir,
                )
            elif now - self._started_at > self.broker.ready_timeout:
                waited = now - self._started_at
                log.error("embedded Kafka broker not ready %.0fs after its restart; killing it", waited)
                self.broker.kill()
                self._exited(now)

    def _launch(self, now: float) -> None:
        self._restart_at = None
        self._started_at = now
        self._serving_since = None
        try:
            self.broker.start(wait=False)
        except ServerStartError as exc:
            log.error("embedded Kafka broker could not be started again: %s", exc)
            self._exited(now, how="did not start")
            return
        log.info("restarted the embedded Kafka broker (pid %s, restart #%d)", self.broker.pid, self.restarts)

    def _exited(self, now: float, how: str | None = None) -> None:
        """Schedule the next start; ``how`` overrides the exit status in the log line."""
        process = self.broker.process
        if how is None:
            status = process.returncode if process is not None else None
            how = describe_exit(status) if status is not None else "exited"
        ran_for = now - self._started_at
        served = now - self._serving_since if self._serving_since is not None else 0.0
        delay = self.tracker.exited(served)
        self._serving_since = None
        self._restart_at = now + delay
        tail = process.log_tail(_TAIL_BYTES) if process is not None and self.tracker.crash_looping else ""
        log.warning(
            "embedded Kafka broker on %s exited (%s) after %.1fs; restart #%d in %.1fs on its data in %s%s",
            self.broker.bootstrap,
            how,
            ran_for,
            self.tracker.total,
            delay,
            self.broker.data_dir,
            f" (crash-looping: {self.tracker.consecutive} exits in a row)\n{tail}" if tail else "",
        )
