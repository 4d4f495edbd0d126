"""The project's table recovery: what a rebalance reads of each partition, and what it reports."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from faust.exceptions import ConsistencyError
from faust.types import TP

from app.platform.faust import recovery as recovery_module
from app.platform.faust.readiness import WorkerState, readiness
from app.platform.faust.recovery import (
    EXIT_TABLES_AHEAD_OF_BROKER,
    TableProgress,
    TableRecovery,
    changelog_events,
    plan_partitions,
    stop_status,
)
from app.platform.kafka.changelog import Change, ChangelogRange
from app.platform.settings import Settings

TOPIC = "avcc-code-records-changelog"


def tp(partition: int) -> TP:
    return TP(TOPIC, partition)


def test_an_empty_active_store_is_restored_to_the_high_watermark_and_reported_there() -> None:
    plan = plan_partitions({tp(0)}, set(), {tp(0): -1}, {(TOPIC, 0): 1000}, {})
    [restore] = plan.ranges
    assert (restore.position, restore.end) == (0, 1000)
    assert plan.claims == {tp(0): 999}  # faust's recovery has nothing left to read
    assert plan.dropped == []


def test_a_kept_store_restores_only_its_tail() -> None:
    plan = plan_partitions({tp(0)}, set(), {tp(0): 949}, {(TOPIC, 0): 1000}, {})
    [restore] = plan.ranges
    assert (restore.position, restore.end, restore.remaining) == (950, 1000, 50)


def test_a_current_store_reads_nothing_and_keeps_its_own_checkpoint() -> None:
    plan = plan_partitions({tp(0)}, set(), {tp(0): 999}, {(TOPIC, 0): 1000}, {})
    assert plan.ranges == [] and plan.claims == {tp(0): None}


def test_a_store_ahead_of_its_changelog_is_left_to_faust_s_consistency_check() -> None:
    reading = {(TOPIC, 1): ChangelogRange(TOPIC, 1, 10, None)}
    plan = plan_partitions(
        {tp(0)}, {tp(1)}, {tp(0): 5000, tp(1): 5000}, {(TOPIC, 0): 1000, (TOPIC, 1): 10}, reading
    )
    assert plan.ranges == []
    assert plan.claims == {tp(0): None, tp(1): None}  # the store's own offset: faust sees it ahead
    assert plan.dropped == [(TOPIC, 1)]


def test_a_standby_is_followed_from_its_checkpoint_and_faust_starts_its_tail_at_the_end() -> None:
    plan = plan_partitions(set(), {tp(2)}, {tp(2): 99}, {(TOPIC, 2): 1000}, {})
    [follow] = plan.ranges
    assert (follow.position, follow.end, follow.high, follow.remaining) == (100, None, 1000, 900)
    assert plan.claims == {tp(2): 999}


def test_a_standby_already_followed_goes_on_unchanged() -> None:
    following = ChangelogRange(TOPIC, 2, 500, None)
    plan = plan_partitions(set(), {tp(2)}, {tp(2): 499}, {(TOPIC, 2): 1000}, {(TOPIC, 2): following})
    assert plan.ranges == [] and plan.claims == {tp(2): 999}


def test_a_promoted_standby_that_is_current_stops_being_followed() -> None:
    following = ChangelogRange(TOPIC, 2, 1000, None)
    plan = plan_partitions({tp(2)}, set(), {tp(2): 999}, {(TOPIC, 2): 1000}, {(TOPIC, 2): following})
    assert plan.ranges == [] and plan.dropped == [(TOPIC, 2)] and plan.claims == {tp(2): None}


def test_a_promoted_standby_behind_restores_its_tail_instead_of_following() -> None:
    following = ChangelogRange(TOPIC, 2, 980, None)
    plan = plan_partitions({tp(2)}, set(), {tp(2): 979}, {(TOPIC, 2): 1000}, {(TOPIC, 2): following})
    [restore] = plan.ranges
    assert (restore.position, restore.end) == (980, 1000)
    assert plan.claims == {tp(2): 999}


def test_a_restore_under_way_goes_on_at_a_second_rebalance() -> None:
    under_way = ChangelogRange(TOPIC, 0, 400, 1000)
    plan = plan_partitions({tp(0)}, set(), {tp(0): 399}, {(TOPIC, 0): 1200}, {(TOPIC, 0): under_way})
    assert plan.ranges == [] and plan.claims == {tp(0): 999}


def test_a_demoted_active_is_followed_as_a_standby() -> None:
    done = ChangelogRange(TOPIC, 0, 1000, 1000)
    plan = plan_partitions(set(), {tp(0)}, {tp(0): 999}, {(TOPIC, 0): 1100}, {(TOPIC, 0): done})
    [follow] = plan.ranges
    assert (follow.position, follow.end) == (1000, None)


def test_progress_says_how_far_and_how_long() -> None:
    progress = TableProgress("records", 1200, 400_000, 100_000.0, 0.012, 0)
    assert progress.recovering
    assert progress.describe() == "records: recovering 1200 of 400000 changelog records, ETA 0 s"
    assert progress.as_dict()["eta_s"] == 0.0
    idle = TableProgress("records", 0, 0, 0.0, None, 7)
    assert not idle.recovering and idle.as_dict()["standby_lag"] == 7


class ReportedRecovery(TableRecovery):
    """A recovery whose progress is given (the reader and stores are not needed to report it)."""

    def __init__(self, progress: list[TableProgress]) -> None:
        self._progress = progress

    def progress(self) -> list[TableProgress]:
        return self._progress


def test_ready_reports_a_restore_as_soon_as_it_runs_even_before_the_worker_says_started() -> None:
    tables = [TableProgress("claims", 0, 0, 0.0, None, 0), TableProgress("records", 500, 900, 50.0, 10.0, 0)]
    app = SimpleNamespace(crashed=False, table_recovery=ReportedRecovery(tables))
    for started in (False, True):
        ok, body = readiness(app, WorkerState("code", consumer=True, started=started))  # type: ignore[arg-type]
        assert not ok and body["status"] == "recovering"
        assert body["reason"] == "records: recovering 500 of 900 changelog records, ETA 10 s"
        assert [t["table"] for t in body["tables"]] == ["claims", "records"]


def test_restored_changes_read_as_faust_s_changelog_events() -> None:
    [event] = changelog_events(tp(3), [Change(41, b"k", b"v")])
    message = event.message
    assert (message.tp, message.partition, message.offset, message.key, message.value) == (
        tp(3),
        3,
        41,
        b"k",
        b"v",
    )


def test_a_worker_stopping_late_exits_with_the_status_it_would_have_stopped_with() -> None:
    assert stop_status(SimpleNamespace(crashed=False, crash_reason=None)) == 0
    assert stop_status(SimpleNamespace(crashed=True, crash_reason=RuntimeError("x"))) == 1
    ahead = SimpleNamespace(crashed=True, crash_reason=ConsistencyError("ahead"))
    assert stop_status(ahead) == EXIT_TABLES_AHEAD_OF_BROKER == 65


def code_recovery(monkeypatch: pytest.MonkeyPatch) -> tuple[TableRecovery, list[ChangelogRange]]:
    """A code worker's recovery whose reader records what it is given instead of reading."""
    app = SimpleNamespace(conf=SimpleNamespace(id="avcc-code"), tables={})
    recovery = TableRecovery(app, Settings())
    added: list[ChangelogRange] = []
    monkeypatch.setattr(recovery.reader, "_ensure_thread", lambda: added.extend(recovery.reader.ranges()))
    return recovery, added


def records_table(checkpoint: int) -> Any:
    return SimpleNamespace(name="records", data=SimpleNamespace(persisted_offset=lambda tp: checkpoint))


def test_changelog_ends_unknown_leave_a_promoted_standby_to_faust_from_its_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A standby followed up to offset 20 (its claim said 49) becomes active while the broker
    refuses the changelog ends (a leader election): nothing of the old plan may stay, or the
    partition would be served as current while 29 records behind (found by a 3-node failover)."""
    recovery, _ = code_recovery(monkeypatch)
    recovery.reader.add([ChangelogRange(TOPIC, 0, 21, None, high=50)])
    recovery.claims[tp(0)] = 49
    asked: list[float] = []

    def refuse(keys: Any, timeout_s: float) -> dict[Any, int]:
        asked.append(timeout_s)
        raise RuntimeError("FENCED_LEADER_EPOCH")

    monkeypatch.setattr(recovery.reader, "high_watermarks", refuse)
    monkeypatch.setattr(recovery_module, "WATERMARK_TIMEOUT_S", 0.6)
    asyncio.run(recovery.plan(records_table(20), {tp(0)}, set()))
    assert len(asked) > 1, "a refusal is asked again while the time lasts"
    assert recovery.claimed(tp(0)) is None, "faust restores from the store's own checkpoint"
    assert recovery.reader.ranges() == [], "the standby is no longer followed"


def test_a_moment_of_refusal_is_asked_again_and_the_restore_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    recovery, added = code_recovery(monkeypatch)
    answers: list[Exception | dict[Any, int]] = [RuntimeError("NOT_LEADER_OR_FOLLOWER"), {(TOPIC, 0): 50}]

    def answer(keys: Any, timeout_s: float) -> dict[Any, int]:
        given = answers.pop(0)
        if isinstance(given, Exception):
            raise given
        return given

    monkeypatch.setattr(recovery.reader, "high_watermarks", answer)
    asyncio.run(recovery.plan(records_table(20), {tp(0)}, set()))
    assert recovery.claimed(tp(0)) == 49
    assert [(r.position, r.end) for r in added] == [(21, 50)]
