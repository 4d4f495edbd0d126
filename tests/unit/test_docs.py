"""The documentation follows the code: every generated block is fresh, every exit status the code
can end with is documented, and the README stays a short front page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.platform.metrics import TIME_TO_CODE
from scripts.docgen import BLOCKS
from scripts.docgen.blocks import Block
from scripts.docgen.exits import STATUSES, exit_constants, raised_statuses
from scripts.docgen.metrics import _label_names

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


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


def test_the_readme_is_a_short_front_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert not re.search(r"shared/|/work/", text), "the README names a file outside the repository"
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].strip()
    commands = text.split("\n## The two commands\n", 1)[1].split("\n## ", 1)[0]
    assert f"\n{ci_command} " in commands, (
        f"the README's test command is not what .ci/run runs ({ci_command})"
    )
    assert "\nmake run " in commands


def test_no_page_keeps_a_diary() -> None:
    """Dated measurements live in bench/RESULTS.md only."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b|as of this writing", text), page


def test_the_metrics_reference_reads_the_label_names_the_client_library_keeps() -> None:
    """The metrics page reads label names from prometheus_client's metric objects (``_labelnames``:
    the registry does not collect them for a metric that has observed nothing). This fails the
    day the library keeps them elsewhere, before the page silently loses its labels."""
    assert TIME_TO_CODE._labelnames == ("level", "outcome", "review")
    assert _label_names()["avcc_time_to_code_seconds"] == ("level", "outcome", "review")
