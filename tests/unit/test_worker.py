"""A worker whose tables are ahead of the broker's changelogs (faust's ConsistencyError) exits with
its own status and says what to delete; any other exit of faust's worker passes through as is."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.exceptions import ConsistencyError

import app.platform.internal_topics as internal_topics
import app.platform.kafka.access as access
import app.platform.kafka.admin as admin
from app.platform.groups import group_spec
from app.worker import EXIT_TABLES_AHEAD_OF_BROKER, run_worker, tables_ahead_of_broker

SPEC = group_spec("code")


async def test_a_consistency_error_in_table_recovery_is_what_crashed_the_app() -> None:
    """faust's recovery service crashes with it, and mode marks every service above it (the App)."""
    app = faust.App("test-worker-crash", broker="memory://", store="memory://")
    assert tables_ahead_of_broker(app) is None
    await app.tables.recovery.crash(ConsistencyError("The persisted offset ... is higher"))
    assert isinstance(tables_ahead_of_broker(app), ConsistencyError)


class _FakeApp:
    """What ``run_worker`` needs of a faust App: ``main()`` (faust exits 1 on any crash)."""

    def __init__(self, crash: BaseException | None, datadir: Path) -> None:
        self.crash_reason = crash
        self.conf = SimpleNamespace(datadir=datadir)

    def main(self) -> None:
        raise SystemExit(1 if self.crash_reason is not None else 0)


def _run(monkeypatch: pytest.MonkeyPatch, app: _FakeApp) -> SystemExit:
    monkeypatch.setattr(internal_topics, "group_app", lambda spec: app)
    monkeypatch.setattr(internal_topics, "worker_topics", lambda spec: [])
    monkeypatch.setattr(admin, "apply_plan", lambda settings, topics: SimpleNamespace(unfixed=[]))
    monkeypatch.setattr(access, "check_kafka_access", lambda settings, spec: None)
    with pytest.raises(SystemExit) as exited:
        run_worker(SPEC, [])
    return exited.value


def test_tables_ahead_of_the_broker_exit_with_their_own_status_and_say_what_to_delete(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reason = ConsistencyError("The persisted offset for changelog topic partition x is higher")
    caplog.set_level(logging.CRITICAL, logger="avcc.worker")
    exited = _run(monkeypatch, _FakeApp(reason, tmp_path / "workers" / "code"))
    assert exited.code == EXIT_TABLES_AHEAD_OF_BROKER == 65
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("group code stops: its tables in ") and "ahead of the broker's changelogs" in line
    assert f"Delete {tmp_path / 'workers' / 'code'}" in line and "make clean" in line
    assert "persisted offset" in line


@pytest.mark.parametrize("crash", [None, RuntimeError("anything else")])
def test_every_other_exit_of_faust_passes_through(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, crash: Any
) -> None:
    exited = _run(monkeypatch, _FakeApp(crash, tmp_path))
    assert exited.code == (0 if crash is None else 1)
