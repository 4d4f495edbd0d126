"""State of the review group: review tasks with their reports, parked review inputs.

Backed by faust tables of App ``avcc-review`` in RocksDB (``<datadir>/workers/review``), each
replicated to its compacted changelog topic ``avcc-review-<table>-changelog``:

* ``tasks`` - avcc_record_id -> :class:`ReviewTask`, co-partitioned with apply.created and the
  human-decision topic;
* ``review-inputs-parked`` - message ids of inputs waiting in the retry path, per record.
"""

from __future__ import annotations

from typing import Any

from app.lifecycle.review.tasks import ReviewTask
from app.platform.faust.app import get_app
from app.platform.faust.tables import ModelTable, model_table, parking_table
from app.platform.topics import APPLY_CREATED

__all__ = ["parking", "tasks"]

_app = get_app("review")

tasks: ModelTable[ReviewTask] = model_table(
    _app,
    "tasks",
    ReviewTask,
    partitions=APPLY_CREATED.partitions,
    help="Review tasks and reports (review group)",
)
parking: Any = parking_table(_app, "review-inputs", APPLY_CREATED.partitions)
