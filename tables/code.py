"""Tables of the code group: record lifecycle state and application claims."""

from __future__ import annotations

from typing import Any

from app.platform.faust.app import get_app
from app.platform.topics import APPLY_CREATED, CODE_CLAIMS

__all__ = ["claims", "records"]

_app = get_app("code")

#: avcc_record_id (UTF-8 decimal) -> RecordState JSON, co-partitioned with the record topics.
records: Any = _app.Table(
    "records",
    partitions=APPLY_CREATED.partitions,
    key_type=bytes,
    value_type=bytes,
    help="Per-record lifecycle state (code group)",
)

#: content_hash -> claim JSON ({avcc_record_id, request_id}); plus one id counter per partition.
claims: Any = _app.Table(
    "claims",
    partitions=CODE_CLAIMS.partitions,
    key_type=bytes,
    value_type=bytes,
    help="One work, one record: content hash claims (code group)",
)
