"""The documentation follows the code: every generated block is fresh, and every exit status the
code can end with is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts.docgen import BLOCKS
from scripts.docgen.blocks import Block
from scripts.docgen.exits import STATUSES, exit_constants, raised_statuses

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b.page}:{b.name}")
def test_generated_block_is_fresh(block: Block) -> None:
    assert block.current() == block.wanted(), (
        f"{block.page} ({block.name}) is stale: python -m scripts.docgen"
    )


def test_every_exit_status_the_code_ends_with_is_documented() -> None:
    documented = {row.status for row in STATUSES}
    missing = {status: where for status, where in raised_statuses().items() if status not in documented}
    assert not missing, f"exit statuses without a row in scripts/docgen/exits.py STATUSES: {missing}"


def test_every_exit_constant_has_its_row_and_every_row_its_constant() -> None:
    constants = {c.name: c for c in exit_constants()}
    named = {row.constant: row for row in STATUSES if row.constant}
    assert set(constants) == set(named), "a row per exit constant, and a constant per named row"
    for name, row in named.items():
        assert constants[name].status == row.status, (
            f"{name} is {constants[name].status}, its row says {row.status}"
        )
        assert constants[name].doc, f"{name} ({constants[name].where}) has no #: comment saying what it means"


def test_no_page_keeps_a_diary() -> None:
    """Dated measurements live in bench/RESULTS.md only."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    for page in pages:
        text = page.read_text()
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b|as of this writing", text), page
