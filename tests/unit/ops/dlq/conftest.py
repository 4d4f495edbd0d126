"""Fixtures of the DLQ unit tests: a recording producer and a store in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.ops.dlq.store import DlqStore
from tests.unit.ops.dlq.dead_letters import FakeSender


@pytest.fixture
def sender() -> FakeSender:
    return FakeSender()


@pytest.fixture
def store(tmp_path: Path, sender: FakeSender) -> Iterator[DlqStore]:
    with DlqStore(tmp_path / "dlq", sender=sender) as s:
        yield s
