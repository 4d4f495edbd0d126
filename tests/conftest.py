"""Test-suite wide hooks: integration marking, CI detection, the random order's seed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.figures import reported

__all__ = ["in_ci"]

_INTEGRATION_DIR = Path(__file__).parent / "integration"


def in_ci() -> bool:
    """True when running under CI (``CI=true``): missing servers fail instead of skipping."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)


def _seed_line(config: pytest.Config) -> str | None:
    seed = getattr(config.option, "randomly_seed", None)
    if seed is None or not config.pluginmanager.hasplugin("randomly"):
        return None
    return f"random order: --randomly-seed={seed} (replay this order with -p randomly --randomly-seed={seed})"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Print the random-order seed even under ``-q`` (pytest-randomly puts it in the header only)."""
    line = _seed_line(session.config)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    figures = reported(config)
    if figures:
        terminalreporter.section("figures reported by the tests")
        for figure in figures:
            terminalreporter.write_line(figure)
    line = _seed_line(config)
    if line:
        terminalreporter.write_line(line)
