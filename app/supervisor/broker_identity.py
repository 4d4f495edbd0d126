"""Do the workers' tables belong to this broker? The Kafka cluster id recorded beside them says.

The workers keep their tables in RocksDB under ``<data dir>/workers`` and remember, per changelog
partition, the offset they have read up to. Those offsets only mean something on the broker that
holds those changelogs. When the broker's data is deleted or replaced (``var/kafka`` removed,
another broker behind ``AVCC_KAFKA_URL``) but the tables are kept, the workers' offsets point past
the new changelogs and faust stops them (``ConsistencyError``), restart after restart.

So the dev stack writes the broker's cluster id to ``<data dir>/workers/kafka-cluster-id`` the
first time it starts workers there, and before every later start compares it with the broker's:
on a difference it refuses to start, saying what to delete, instead of letting the workers
crash-loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from app.platform.errors import ConfigurationError

__all__ = ["CLUSTER_ID_FILE", "TablesFromAnotherBroker", "check_tables_belong_to"]

#: The record's file name inside the workers' data dir.
CLUSTER_ID_FILE: Final = "kafka-cluster-id"


class TablesFromAnotherBroker(ConfigurationError):
    """The workers' tables were built on another broker (or one whose data was since deleted).
    Delete the workers' data dir to rebuild them from this broker, or ``make clean``."""

    def __init__(self, workers_dir: Path, recorded: str | None, current: str) -> None:
        self.workers_dir = workers_dir
        self.recorded = recorded
        self.current = current
        built_on = (
            f"the broker with cluster id {recorded}, but the broker now answers with cluster id "
            f"{current}: its data was deleted or replaced"
            if recorded is not None
            else "a broker whose cluster id was never recorded (an `avcc dev` before Apache Kafka, "
            f"whose broker kept nothing), not on this one (cluster id {current})"
        )
        super().__init__(
            f"the workers' tables in {workers_dir} were built on {built_on}. Their changelog "
            "offsets point past what this broker holds, so the workers would stop at once, over and "
            f"over (faust's ConsistencyError). To reset: delete {workers_dir} (the tables are rebuilt "
            "from this broker; what only the old broker held is gone), or `make clean` to start the "
            "whole stack afresh."
        )


def _holds_tables(workers_dir: Path) -> bool:
    """Whether any worker wrote a file there (a group's empty data dir holds no offsets)."""
    return any(p.is_file() and p.name != CLUSTER_ID_FILE for p in workers_dir.rglob("*"))


def check_tables_belong_to(workers_dir: Path, cluster_id: str) -> None:
    """Raise :class:`TablesFromAnotherBroker` unless the tables under ``workers_dir`` were built
    on the broker ``cluster_id``; with no tables yet, record ``cluster_id`` for the next start
    (over an older record, which then guards nothing)."""
    record = workers_dir / CLUSTER_ID_FILE
    recorded = record.read_text().strip() if record.is_file() else None
    if recorded == cluster_id:
        return
    if not _holds_tables(workers_dir):
        workers_dir.mkdir(parents=True, exist_ok=True)
        staging = record.with_suffix(".tmp")
        staging.write_text(cluster_id + "\n")
        staging.replace(record)
        return
    raise TablesFromAnotherBroker(workers_dir, recorded, cluster_id)
