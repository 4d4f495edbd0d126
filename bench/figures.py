"""The benches' figures, one JSON line each with its ``status``: ``"ok"``, or ``"failed"`` and the
reason. A figure that cannot be measured (a baseline whose package is missing, a component that
crashed) is reported as failed and every other figure still prints; the bench then exits 1, so
``make bench-smoke`` fails the build on it."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any, Final

__all__ = ["FAILED", "OK", "MissingPackage", "failed", "is_ok", "measure", "print_figures"]

OK: Final = "ok"
FAILED: Final = "failed"


class MissingPackage(ImportError):
    """A baseline needs a package the runtime install (``make venv``) leaves out."""

    def __init__(self, package: str, extra: str = "dev") -> None:
        super().__init__(
            f"needs the Python package {package}, which `make venv` does not install: "
            f"install the {extra} extras with `make install` (or `.venv/bin/pip install -e '.[{extra}]'`)"
        )


def failed(name: str, reason: str) -> dict[str, Any]:
    """The line of a figure that was not measured, and why."""
    return {"name": name, "status": FAILED, "reason": reason}


def is_ok(figure: dict[str, Any]) -> bool:
    """Whether ``figure`` was measured."""
    return bool(figure.get("status", OK) == OK)


def measure(name: str, produce: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``produce()``'s figure marked ok, or, when it raises, the failed figure ``name`` with the
    exception as its reason (the traceback goes to stderr)."""
    try:
        figure = produce()
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return failed(name, f"{type(exc).__name__}: {exc}")
    return {"name": figure.get("name", name), "status": OK, **figure}


def print_figures(figures: Iterable[dict[str, Any]]) -> int:
    """Print one JSON line per figure; 1 when any of them failed, else 0 (the exit status)."""
    status = 0
    for figure in figures:
        print(json.dumps(figure), flush=True)
        if not is_ok(figure):
            print(f"# {figure['name']} failed: {figure.get('reason')}", file=sys.stderr)
            status = 1
    return status
