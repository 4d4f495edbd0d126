"""State of the anomaly group: snapshots of both detector stages in RocksDB and compacted changelogs.

What backs it: NOT a faust table (the anomaly group's faust App runs without Kafka and declares no
tables); the backend is :mod:`app.playback.anomaly.state`. The detector keeps in memory one
:class:`~app.playback.anomaly.windows.PartitionState` per owned partition of
``topic.playback.event`` (stage 1: open windows, watermark, closed bound, next offset) and one
:class:`~app.playback.anomaly.merge.MergeState` per owned partition of the partials topic (stage 2:
merged windows awaiting completeness, each source partition's mark, the EWMA baseline, next offset).
At every offset commit it writes a snapshot of each changed state

1. to a local RocksDB store opened with rocksdict (:class:`WindowStore`, key ``p:<partition>``
   for stage 1, ``m:<partition>`` for stage 2, at :func:`window_store_dir`:
   ``<data_dir>/workers/anomaly/windows`` unless configured), and
2. to its compacted topic -- :data:`ANOMALY_WINDOW_CHANGELOG` (partition = the source
   partition) or :data:`ANOMALY_MERGE_CHANGELOG` (partition = the partials partition) -- with
   acks=all, waited for before the offsets are committed.

On assignment a partition's snapshot is taken from the local store when its offset is at least the
group's committed offset (it is current), else from its changelog's last record
(:func:`~app.playback.anomaly.state.read_changelog`), and the consumer seeks to the snapshot's
offset: state and position always match, whichever worker restores them. Snapshots hold only open
windows (pairs seen once left out, the biggest ``max_pairs`` kept) and the baseline (pruned,
capped).
"""

from __future__ import annotations

from app.platform.topics import ANOMALY_MERGE_CHANGELOG, ANOMALY_WINDOW_CHANGELOG, ANOMALY_WINDOW_PARTIALS
from app.playback.anomaly.state import WindowStore, window_store_dir

__all__ = [
    "ANOMALY_MERGE_CHANGELOG",
    "ANOMALY_WINDOW_CHANGELOG",
    "ANOMALY_WINDOW_PARTIALS",
    "WindowStore",
    "window_store_dir",
]
