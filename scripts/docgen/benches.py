"""The benches: what each of the Makefile's benches measures (its module's docstring) and the
exact commands ``make bench`` and ``make bench-smoke`` run."""

from __future__ import annotations

import importlib
import inspect
import re
import shlex

from scripts.docgen.blocks import ROOT
from scripts.docgen.schema_md import docstring_text

__all__ = ["benches", "make_list"]


def make_list(variable: str) -> list[str]:
    """The quoted items of a Makefile list variable (``NAME = 'a b' \\ 'c'``)."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{variable} = \\\n((?:\t.*\\\n)*\t.*\n)", text, re.MULTILINE)
    if match is None:
        raise ValueError(f"Makefile: no list {variable}")
    return shlex.split(match[1].replace("\\\n", " "))


def benches() -> str:
    """A section per bench: the two commands, then what it measures and prints."""
    smoke = {item.split()[0]: item for item in make_list("BENCH_SMOKE")}
    parts = []
    for item in make_list("BENCH"):
        module = item.split()[0]
        doc = inspect.getdoc(importlib.import_module(module)) or ""
        parts.append(f"### `{module}`")
        commands = [f"make bench:       python -m {item}"]
        if module in smoke:
            commands.append(f"make bench-smoke: python -m {smoke[module]}")
        parts.append("```\n" + "\n".join(commands) + "\n```")
        parts.append(docstring_text(doc))
    return "\n\n".join(parts)
