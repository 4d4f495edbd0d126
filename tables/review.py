"""Tables of the review group: review tasks with their reports."""

from __future__ import annotations

from typing import Any

from app.platform.faust.app import get_app
from app.platform.topics import APPLY_CREATED

__all__ = ["tasks"]

#: avcc_record_id -> ReviewTask JSON, co-partitioned with apply.created and the decision topic.
tasks: Any = get_app("review").Table(
    "tasks",
    partitions=APPLY_CREATED.partitions,
    key_type=bytes,
    value_type=bytes,
    help="Review tasks and reports (review group)",
)
