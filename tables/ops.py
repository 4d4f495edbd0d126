"""State of the ops group: the DLQ index and audit trail (shared through Kafka), the lag history in memory.

The ops group has no faust table; what it keeps, and what backs it:

* **DLQ index + operator state** (:class:`app.ops.dlq.store.DlqStore`): a local RocksDB
  (rocksdict, raw mode) at :func:`dlq_store_path`, ``<data dir>/dlq``, that is only a *cache*: it
  is the materialised view of two Kafka topics, and deleting it loses nothing.

  - ``topic.system.dlq``: the dead letters themselves (key, value, headers).
  - ``topic.system.dlq.state`` (:data:`app.platform.topics.DLQ_STATE`): every operator change -
    status, full audit trail, re-injection count and claim - produced with the core profile
    (acks=all, idempotent) and applied by this replica *before* the operator is answered
    (:mod:`app.ops.dlq.journal`). Changes are keyed by ``group|event id``, carry the event version
    they were computed from and are applied in log order with a compare step
    (:mod:`app.ops.dlq.state`): of two replicas acting at once, the first change wins on every
    replica and the other operator is told to reload. A re-injection first *claims* the event in
    the log, so only one replica produces it (a claim expires after
    :data:`app.ops.dlq.state.CLAIM_TTL_MS` if its replica died).

  Every ops replica reads both topics from the beginning (manual assignment of every partition),
  so a lost disk is rebuilt and any number of replicas serve one view. Keys: ``m:<dlq_id>`` entry
  JSON and ``o:<partition>`` next DLQ offset (one batch); ``s:<dlq_id>`` operator state,
  ``r:<group>|<event id>`` event version / re-injections / claim and ``q:<partition>`` next state
  offset (one batch).
* **DLQ positions in Kafka**: the store's next offsets are mirrored as the commits of consumer
  group :data:`DLQ_CONSUMER_GROUP` (by every replica, for both topics), only so the lag monitor
  sees the indexer's lag; each store's own offsets are the truth.
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

from app.ops.dlq.service import DLQ_CONSUMER_GROUP, DLQ_STORE_DIR, dlq_store_path

__all__ = ["DLQ_CONSUMER_GROUP", "DLQ_STORE_DIR", "dlq_store_path"]
