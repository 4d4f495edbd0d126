"""The headless Chromium of the browser tests: skipped locally when missing, a failure in CI.

Mirrors how tests/integration/conftest.py treats a missing server: a CI run (``CI=true``) must
not pass by skipping what it was meant to check.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType
from typing import Any, Literal, NoReturn

import pytest

__all__ = [
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "chromium",
    "goto_past_refresh",
    "in_ci",
    "in_one_document",
    "playwright",
]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def in_ci() -> bool:
    """Whether this run is CI (``CI`` set to 1/true/yes)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _missing(what: str) -> NoReturn:
    if in_ci():
        pytest.fail(f"{what} is missing on this CI machine", pytrace=False)
    pytest.skip(f"{what} not installed")


def playwright(api: Literal["async_api", "sync_api"]) -> ModuleType:
    """The playwright API module (the browser driver)."""
    try:
        return importlib.import_module(f"playwright.{api}")
    except ImportError:
        _missing("playwright")


def chromium() -> str:
    """Path of the Chromium executable."""
    path = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if path is None:
        _missing("chromium")
    return path


async def goto_past_refresh(page: Any, url: str, attempts: int = 3) -> None:
    """``page.goto(url)`` from a page that refreshes itself (the lag page, every lag interval:
    1 s in these tests): a refresh that starts at the same moment aborts the goto
    (``net::ERR_ABORTED``), so go again."""
    for attempt in range(attempts):
        try:
            await page.goto(url)
            return
        except Exception as exc:
            if "ERR_ABORTED" not in str(exc) or attempt == attempts - 1:
                raise


async def in_one_document(page: Any, script: str, arg: Any = None, attempts: int = 20) -> Any:
    """Evaluate ``script`` (a JS function of ``arg``) in the page: one JS task, so a page that
    reloads itself (the lag page's meta refresh) cannot change between the reads it makes; a
    reload that destroys the context during the call makes it run again in the new document."""
    for attempt in range(attempts):
        try:
            await page.wait_for_load_state("load")
            return await page.evaluate(script, arg)
        except Exception as exc:
            if "context was destroyed" not in str(exc) and "navigat" not in str(exc).lower():
                raise
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
