"""Anomaly group (anomaly-svc): the faust App that runs the windowed anomaly detector (replaces Flink).

The detection itself lives in :mod:`app.playback.anomaly`: pure event-time windows
(:mod:`~app.playback.anomaly.windows`), the seed's rules (:mod:`~app.playback.anomaly.rules`)
and the I/O loop (:class:`~app.playback.anomaly.detector.AnomalyDetector`, its own
confluent-kafka consumer in group ``avcc-anomaly``); its state is declared in
:mod:`tables.anomaly`. This module wires the detector into a worker: a ``mode.Service`` runs it
in a thread, and the common views report its assignment.

Scaling: detection runs in two stages in the one consumer group: stage 1 windows the events of
the source partitions a worker owns and sends partial aggregates, bucketed by code, to the
partials topic; stage 2 merges each code's partials from every source partition and evaluates
a window once all source partitions have closed it. The findings are the same with any number
of workers (up to 24 for stage 1, 12 for stage 2), see :mod:`app.playback.anomaly.detector`.

Run: ``faust -A agents.anomaly worker --web-port 6073`` (or ``avcc worker anomaly``).
"""

from __future__ import annotations

import asyncio
import logging
import threading

import faust
import mode

from app.platform.faust.app import get_app
from app.platform.http.views import install_common_views
from app.platform.settings import get_settings
from app.playback.anomaly.detector import GROUP, AnomalyDetector

__all__ = ["AnomalyService", "app"]

log = logging.getLogger(__name__)

app: faust.App = get_app(GROUP)
# The detector has its own consumer in group avcc-anomaly; faust's consumer (another assignor)
# must not join that group, and its producer would be unused. The web server still runs.
app.boot_strategy = app.BootStrategy(app, enable_kafka=False)

#: The running detector (set while the service runs), for /ready and the lag export.
_running: list[AnomalyDetector] = []


def _assigned() -> list[tuple[str, int]]:
    if not _running:
        raise RuntimeError("the anomaly detector is not running")
    return _running[0].assigned_partitions()


install_common_views(app, GROUP, assignment=_assigned)


@app.service
class AnomalyService(mode.Service):
    """Runs :class:`AnomalyDetector` in a thread for the worker's lifetime.

    A crash of the loop (e.g. the changelog is unwritable) crashes the service, so the worker
    stops instead of consuming without durable state. Stopping waits for the loop's final
    checkpoint (at most ``stop_timeout_s``).
    """

    stop_timeout_s: float = 60.0
    detector: AnomalyDetector | None = None
    _thread: threading.Thread | None = None

    async def on_start(self) -> None:
        loop = asyncio.get_running_loop()
        detector = self.detector = AnomalyDetector(get_settings())
        _running[:] = [detector]

        def main() -> None:
            try:
                detector.run()
            except Exception as exc:
                log.exception("anomaly detector crashed")
                asyncio.run_coroutine_threadsafe(self.crash(exc), loop)

        self._thread = threading.Thread(target=main, name="anomaly-detector", daemon=False)
        self._thread.start()

    async def on_stop(self) -> None:
        _running.clear()
        if self.detector is not None:
            self.detector.stop()
        thread = self._thread
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, self.stop_timeout_s)
            if thread.is_alive():
                log.error("anomaly detector did not stop within %.0f s", self.stop_timeout_s)
