"""Where a process's time goes, from the collapsed stacks py-spy records (``-f raw``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

__all__ = ["IDLE_FRAMES", "summarize"]

#: Leaf frames of a thread that waits (py-spy samples some of them as active).
IDLE_FRAMES = ("select (selectors.py", "_poll_loop (", "wait (threading.py", "_read_session (")


def _idle(leaf: str) -> bool:
    return any(marker in leaf for marker in IDLE_FRAMES)


def _frame(name: str) -> str:
    """``function (path/to/file.py:line)`` -> ``function (file.py)``."""
    function, _, where = name.partition(" (")
    return f"{function} ({where.rsplit('/', 1)[-1].split(':', 1)[0]})" if where else function


def summarize(folded: Path, top: int = 25, below: float = 0.6) -> list[str]:
    """The frames with the most busy samples, inclusive of what they call (one line each),
    leaving out those under ``below`` of all of them (the event loop and the command line)."""
    inclusive: Counter[str] = Counter()
    busy = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")[1:]
        if not frames or _idle(frames[-1]):
            continue
        samples = int(count)
        busy += samples
        for frame in {_frame(f) for f in frames}:
            inclusive[frame] += samples
    if not busy:
        return ["no busy samples"]
    shares = [(frame, n) for frame, n in inclusive.most_common() if n < below * busy]
    return [f"{100 * n / busy:5.1f} %  {frame}" for frame, n in shares[:top]]
