"""The private parts of faust and aiokafka the project relies on live in one small module, which
refuses to import once the libraries change the shape it relies on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.platform.faust import internals

ROOT = Path(__file__).resolve().parents[3]
#: Private names of faust and aiokafka the earlier fork of faust's consumer overrode or read.
FORKED_NAMES = (
    "_add_gap",
    "_new_offset",
    "_filter_tps_with_pending_acks",
    "_read_offset",
    "_committed_offset",
    "_acked",
    "_gap",
    "_unacked_messages",
    "_drain_replies",
    "_send_pending",
    "_proc_fetch_request",
    "_fetch_max_wait_ms",
    "_paused_partitions",
    "_current_event",
    "_ensure_consumer",
)


def test_the_shape_holds_for_the_pinned_versions() -> None:
    internals.check_shape()
    setup = (ROOT / "setup.cfg").read_text()
    for package, version in internals.PINNED.items():
        assert re.search(rf"^\s*{re.escape(package)}=={re.escape(version)}\s*$", setup, re.M), package


def test_another_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internals, "version", lambda package: "9.9.9")
    with pytest.raises(internals.ShapeChanged, match=r"9\.9\.9"):
        internals.check_shape()


def test_a_missing_private_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(internals.AIOKafkaConsumerThread, "_ensure_consumer")
    with pytest.raises(internals.ShapeChanged, match="_ensure_consumer"):
        internals.check_shape()
    monkeypatch.undo()
    monkeypatch.setattr(internals.ThreadDelegateConsumer, "__annotations__", {})
    with pytest.raises(internals.ShapeChanged, match="_thread"):
        internals.check_shape()


def test_no_private_name_of_faust_or_aiokafka_is_used_outside_the_internals_module() -> None:
    module = ROOT / "app" / "platform" / "faust" / "internals.py"
    assert len(module.read_text().splitlines()) < 150
    pattern = re.compile(r"\.(" + "|".join(re.escape(n) for n in FORKED_NAMES) + r")\b")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("app", "agents", "tables")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != module
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
