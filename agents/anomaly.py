"""Anomaly group (anomaly-svc): the faust App that runs the windowed anomaly detector (replaces Flink).

The detection itself lives in :mod:`app.playback.anomaly`: pure event-time windows
(:mod:`~app.playback.anomaly.windows`), the seed's rules (:mod:`~app.playback.anomaly.rules`)
and the I/O loop (:class:`~app.playback.anomaly.detector.AnomalyDetector`, its own
confluent-kafka consumer in group ``avcc-anomaly``); its state is declared in
:mod:`tables.anomaly`. This module wires the detector into a worker as the group's own consumer
(:mod:`app.platform.faust.own_consumer`): it runs in a thread, and the common views report its
assignment.

Scaling: detection runs in two stages in the one consumer group: stage 1 windows the events of
the source partitions a worker owns and sends partial aggregates, bucketed by code, to the
partials topic; stage 2 merges each code's partials from every source partition and evaluates
a window once all source partitions have closed it. The findings are the same with any number
of workers (up to 24 for stage 1, 12 for stage 2), see :mod:`app.playback.anomaly.detector`.

Run: ``faust -A agents.anomaly worker --web-port 6073`` (or ``avcc worker anomaly``).
"""

from __future__ import annotations

import faust

from app.platform.faust.app import get_app
from app.platform.faust.own_consumer import own_consumer
from app.platform.settings import get_settings
from app.playback.anomaly.detector import GROUP, AnomalyDetector

__all__ = ["app", "detector"]

app: faust.App = get_app(GROUP)
# The detector has its own consumer in group avcc-anomaly; faust's consumer (another assignor)
# must not join that group, and its producer would be unused. The web server still runs.
app.boot_strategy = app.BootStrategy(app, enable_kafka=False)

#: The detector, run on a thread of its own for the worker's lifetime: a crash of its loop (e.g.
#: the changelog is unwritable) stops the worker instead of consuming without durable state;
#: stopping waits for its final checkpoint.
detector, common = own_consumer(app, GROUP, lambda: AnomalyDetector(get_settings()))
