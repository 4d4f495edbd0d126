"""CPU time per process from ``/proc``, to say what one unit of work costs each process of a stack."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CpuSampler", "CpuShare", "cpu_seconds"]

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` used so far (its exited children not included)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass(frozen=True, slots=True)
class CpuShare:
    """What one process spent while the stack did ``units`` of work over ``seconds``."""

    name: str
    cpu_s: float
    seconds: float
    units: int

    @property
    def core_percent(self) -> float:
        """Share of one core."""
        return 100 * self.cpu_s / self.seconds

    @property
    def ms_per_unit(self) -> float:
        """CPU milliseconds per unit of work."""
        return 1000 * self.cpu_s / max(1, self.units)


class CpuSampler:
    """CPU each of ``pids`` spends from its creation until :meth:`stop`."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.started = time.monotonic()
        self.before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self, units: int) -> list[CpuShare]:
        """Each process's share while ``units`` of work were done, most expensive first."""
        elapsed = time.monotonic() - self.started
        shares = [
            CpuShare(name, cpu_seconds(pid) - self.before[name], elapsed, units)
            for name, pid in self.pids.items()
        ]
        return sorted(shares, key=lambda share: share.cpu_s, reverse=True)
