"""State of the code group: record lifecycles, application claims, parked record events.

Backed by faust tables of App ``avcc-code`` in RocksDB (``<datadir>/workers/code``), each
replicated to its compacted changelog topic ``avcc-code-<table>-changelog``:

* ``records`` - avcc_record_id -> :class:`RecordState`, co-partitioned with the record topics;
* ``claims`` - content hash -> :class:`Claim`, co-partitioned with the claims topic;
* ``records-parked`` - message ids of record events waiting in the retry path, per record.
"""

from __future__ import annotations

from typing import Any

from app.lifecycle.code.claims import Claim
from app.lifecycle.code.records import RecordState
from app.platform.faust.app import get_app
from app.platform.faust.tables import ModelTable, model_table, parking_table
from app.platform.topics import APPLY_CREATED, CODE_CLAIMS

__all__ = ["claims", "record_parking", "records"]

_app = get_app("code")

records: ModelTable[RecordState] = model_table(
    _app,
    "records",
    RecordState,
    partitions=APPLY_CREATED.partitions,
    help="Per-record lifecycle state (code group)",
)
claims: ModelTable[Claim] = model_table(
    _app,
    "claims",
    Claim,
    partitions=CODE_CLAIMS.partitions,
    help="One work, one record: content hash claims (code group)",
)
record_parking: Any = parking_table(_app, "records", APPLY_CREATED.partitions)
