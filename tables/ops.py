"""State of the ops group: the DLQ index and audit trail on local RocksDB, the lag history in memory.

The ops group has no faust table; what it keeps, and what backs it:

* **DLQ index + audit trail** (:class:`app.ops.dlq.store.DlqStore`): a local RocksDB (rocksdict,
  raw mode) at :func:`dlq_store_path`, ``<data dir>/dlq``. Single copy, owned by one ops worker
  process at a time; no changelog. It is a materialised view of ``topic.system.dlq`` (so a lost
  directory is rebuilt by re-reading the topic from the beginning, minus the statuses and audit
  trail, which exist only here). Keys: ``m:<dlq_id>`` entry JSON, ``o:<partition>`` next DLQ
  offset to index (written in the same batch as the entry), ``r:<group>|<event id>``
  re-injection count of an event over every DLQ generation.
* **DLQ positions in Kafka**: the store's next offsets are mirrored as the commits of consumer
  group :data:`DLQ_CONSUMER_GROUP`, only so the lag monitor sees the indexer's lag; the store's
  own offsets are the truth.
* **Lag history** (:class:`app.ops.lag.monitor.LagEvaluator`): per partition and per
  group/topic samples of the last :attr:`app.ops.lag.settings.LagSettings.history_s` seconds, and
  the active lag alerts (:class:`app.ops.lag.lifecycle.AlertTracker`). In memory only: a restart
  starts an empty history (WARN/STALL/STOP-by-window need a full window again) and fires the
  alerts that are still active once more.
* **Dead-letter alert de-duplication** (:class:`app.ops.alerts.AlertDispatcher`): in memory only.

The retry group (``agents.retry``) keeps no state of its own: its position is the committed
offset of its consumer group, and the partitions it holds back are re-read after a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from app.platform.settings import Settings

__all__ = ["DLQ_CONSUMER_GROUP", "DLQ_STORE_DIR", "dlq_store_path"]

#: Directory of the DLQ store under the data dir.
DLQ_STORE_DIR: Final = "dlq"
#: Consumer group whose commits mirror the DLQ store's positions (for lag monitoring only).
DLQ_CONSUMER_GROUP: Final = "avcc-ops-dlq"


def dlq_store_path(settings: Settings) -> Path:
    """Where the DLQ store lives: ``<data dir>/dlq`` (created on demand)."""
    return settings.resolve_data_path(DLQ_STORE_DIR)
