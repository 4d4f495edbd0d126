"""Test-suite wide hooks: integration marking, CI detection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["in_ci"]

_INTEGRATION_DIR = Path(__file__).parent / "integration"


def in_ci() -> bool:
    """True when running under CI (``CI=true``): missing servers fail instead of skipping."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)
