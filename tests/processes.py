"""What a test may ask about a process it did not start itself (a worker, a broker of a stack)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["alive"]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie waiting for its reaper counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
