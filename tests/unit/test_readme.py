"""The README's configuration tables are generated from the settings classes: keep them current."""

from __future__ import annotations

from pathlib import Path

from scripts.config_table import config_tables

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_config_tables_match_the_settings() -> None:
    text = README.read_text()
    begin, end = "<!-- config:begin -->\n", "<!-- config:end -->"
    current = text[text.index(begin) + len(begin) : text.index(end)]
    assert current == config_tables(), "regenerate with: python -m scripts.config_table"
