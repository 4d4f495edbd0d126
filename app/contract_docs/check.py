"""``avcc contracts check --against REF``: the current contracts against those published at a git ref."""

from __future__ import annotations

from pathlib import Path

import click

from app.contract_docs.acknowledged import acknowledgement
from app.contract_docs.compat import Break, GitRefError, compare_sets, schemas_at_ref
from app.contract_docs.generate import JSON_DIR, ROOT
from app.contract_docs.json_schemas import json_schema_files

__all__ = ["check_against"]


def check_against(ref: str, root: Path = ROOT) -> int:
    """Print the verdict; 0 compatible, 1 breaks found (one line each), 2 the ref cannot be read.

    Breaks listed in :mod:`app.contract_docs.acknowledged` are printed with their
    reason and do not fail the check."""
    try:
        old = schemas_at_ref(root, ref, JSON_DIR)
    except GitRefError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    if old is None:
        click.echo(f"{ref} publishes no {JSON_DIR}: nothing to be compatible with")
        return 0
    breaks: list[Break] = []
    for item in compare_sets(old, json_schema_files()):
        entry = acknowledgement(item)
        if entry is None:
            breaks.append(item)
            click.echo(f"incompatible: {item.line()}", err=True)
        else:
            click.echo(f"acknowledged: {item.line()}: {entry.reason}")
    if breaks:
        click.echo(f"{len(breaks)} backward-incompatible change(s) against {ref}", err=True)
        return 1
    click.echo(f"compatible with {ref}: {len(old)} schema(s) compared")
    return 0
