"""The broker's cluster id recorded beside the workers' tables: recorded on the first start, the
same broker passes, another broker's (or a wiped one's) is refused with what to delete."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.supervisor.broker_identity import CLUSTER_ID_FILE, TablesFromAnotherBroker, check_tables_belong_to


def _tables(group_dir: Path) -> None:
    """What a worker leaves behind: RocksDB files under its group's data dir."""
    (group_dir / "tables" / "records.db").mkdir(parents=True)
    (group_dir / "tables" / "records.db" / "000012.sst").write_bytes(b"rows")


def test_the_first_start_records_the_broker_and_later_starts_on_it_pass(tmp_path: Path) -> None:
    workers = tmp_path / "workers"
    check_tables_belong_to(workers, "cluster-a")
    assert (workers / CLUSTER_ID_FILE).read_text() == "cluster-a\n"
    _tables(workers / "code")
    check_tables_belong_to(workers, "cluster-a")


def test_tables_built_on_another_broker_are_refused_with_the_way_out(tmp_path: Path) -> None:
    workers = tmp_path / "workers"
    check_tables_belong_to(workers, "cluster-a")
    _tables(workers / "code")
    with pytest.raises(TablesFromAnotherBroker) as refused:
        check_tables_belong_to(workers, "cluster-b")
    message = str(refused.value)
    assert "built on the broker with cluster id cluster-a" in message
    assert "now answers with cluster id cluster-b" in message
    assert f"delete {workers}" in message and "make clean" in message and "ConsistencyError" in message
    assert (workers / CLUSTER_ID_FILE).read_text() == "cluster-a\n", "the record is not overwritten"


def test_tables_of_an_unrecorded_broker_are_refused_and_an_empty_dir_is_taken_over(tmp_path: Path) -> None:
    workers = tmp_path / "workers"
    _tables(workers / "review")
    with pytest.raises(TablesFromAnotherBroker, match="cluster id was never recorded"):
        check_tables_belong_to(workers, "cluster-b")
    shutil.rmtree(workers / "review")
    (workers / "review" / "tables").mkdir(parents=True)  # a group's data dir with nothing written
    (workers / CLUSTER_ID_FILE).write_text("cluster-a\n")
    check_tables_belong_to(workers, "cluster-b")  # no tables: nothing to disagree with
    assert (workers / CLUSTER_ID_FILE).read_text() == "cluster-b\n"
