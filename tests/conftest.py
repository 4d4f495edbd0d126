"""Test-suite wide hooks: broker selection (``--brokers``), integration marking, CI detection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["ALL_BROKERS", "in_ci", "selected_brokers"]

ALL_BROKERS = ("tansu", "kafka")
_BROKERS_ENV = "AVCC_TEST_BROKERS"
_INTEGRATION_DIR = Path(__file__).parent / "integration"


def in_ci() -> bool:
    """True when running under CI (``CI=true``): missing servers fail instead of skipping."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("avcc")
    group.addoption(
        "--brokers",
        action="store",
        default=None,
        help=(
            "comma-separated brokers the `broker` fixture runs against "
            f"({', '.join(ALL_BROKERS)}; default: all, or ${_BROKERS_ENV})"
        ),
    )


def selected_brokers(config: pytest.Config) -> tuple[str, ...]:
    """Brokers chosen with ``--brokers`` or ``$AVCC_TEST_BROKERS`` (default: all)."""
    raw = config.getoption("--brokers") or os.environ.get(_BROKERS_ENV) or ""
    chosen = tuple(b.strip().lower() for b in raw.split(",") if b.strip())
    if not chosen:
        return ALL_BROKERS
    unknown = sorted(set(chosen) - set(ALL_BROKERS))
    if unknown:
        raise pytest.UsageError(f"unknown broker(s) {unknown}; choose from {ALL_BROKERS}")
    return chosen


def pytest_configure(config: pytest.Config) -> None:
    selected_brokers(config)  # fail fast on a typo


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    brokers = selected_brokers(config)
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        if _INTEGRATION_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        broker = params.get("broker", params.get("stack_broker"))
        if broker is not None and broker not in brokers:
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
