"""Generated blocks of the documentation: the parts of a Markdown page written by a script.

A page keeps its prose by hand and marks each generated part with two HTML comments (invisible on
the site and on GitHub)::

    <!-- generated: NAME (python -m scripts.docgen; do not edit by hand) -->
    ...
    <!-- end generated: NAME -->

:func:`refresh` rewrites what lies between them from the block's renderer; :func:`stale` lists
the blocks whose page says something else, which the unit tests and ``--check`` fail on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROOT", "Block", "refresh", "stale"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Block:
    """One generated part: the page it lives in (relative to the repository), its name, its renderer."""

    page: str
    name: str
    render: Callable[[], str]

    @property
    def begin(self) -> str:
        """The comment that opens the block."""
        return f"<!-- generated: {self.name} (python -m scripts.docgen; do not edit by hand) -->\n"

    @property
    def end(self) -> str:
        """The comment that closes the block."""
        return f"<!-- end generated: {self.name} -->"

    def _bounds(self, text: str) -> tuple[int, int]:
        start = text.find(self.begin)
        stop = text.find(self.end)
        if start < 0 or stop < start:
            raise ValueError(f"{self.page}: no block {self.name!r} (its two marker comments)")
        return start + len(self.begin), stop

    def current(self) -> str:
        """What the page holds between the markers now."""
        text = (ROOT / self.page).read_text()
        start, stop = self._bounds(text)
        return text[start:stop]

    def wanted(self) -> str:
        """What the renderer makes of the code now (ending with one newline)."""
        return self.render().rstrip("\n") + "\n"

    def write(self, body: str) -> None:
        """Put ``body`` between the markers of the page."""
        path = ROOT / self.page
        text = path.read_text()
        start, stop = self._bounds(text)
        path.write_text(text[:start] + body + text[stop:])


def stale(blocks: Iterable[Block]) -> list[Block]:
    """The blocks whose page differs from what their renderer makes now."""
    return [block for block in blocks if block.current() != block.wanted()]


def refresh(blocks: Iterable[Block]) -> list[Block]:
    """Rewrite every stale block; the ones rewritten."""
    changed = []
    for block in blocks:
        body = block.wanted()
        if block.current() != body:
            block.write(body)
            changed.append(block)
    return changed
