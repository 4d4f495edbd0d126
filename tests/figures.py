"""Figures a test reports for the CI log: pytest hides what a passing test prints, so each line is
also kept on the run's config and printed again in the terminal summary, after the run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import pytest

__all__ = ["FIGURES", "Report", "reported", "reporter"]

#: The lines reported during the run, in order.
FIGURES: Final = pytest.StashKey[list[str]]()

Report = Callable[[str], None]


def reporter(config: pytest.Config, test: str) -> Report:
    """A function that reports a line of ``test`` (its name in front)."""

    def report(line: str) -> None:
        config.stash.setdefault(FIGURES, []).append(f"{test}: {line}")
        print(line)

    return report


def reported(config: pytest.Config) -> list[str]:
    """Every line reported so far."""
    return config.stash.get(FIGURES, [])
