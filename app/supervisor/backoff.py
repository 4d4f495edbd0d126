"""Restart backoff for supervised worker processes: exponential delays, reset after a stable run.

Pure (no clock, no processes): the supervisor tells a :class:`RestartTracker` how long a process
ran before it exited and gets back how long to wait before starting it again. Kubernetes does
the same for a crashing container (10 s doubling to 5 min, reset after 10 min of running);
the dev stack uses shorter defaults (``AVCC_DEV_RESTART_*``) because it restarts processes, not
pods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BackoffPolicy", "RestartTracker"]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """How long to wait before the n-th consecutive restart, and when a run counts as stable.

    The n-th consecutive crash waits ``initial_s * factor ** (n - 1)``, at most ``max_s``. A
    process that ran at least ``stable_s`` before exiting starts a fresh series. From the
    ``crash_loop_after``-th consecutive crash on the process is reported as crash-looping.
    """

    initial_s: float = 1.0
    factor: float = 2.0
    max_s: float = 60.0
    stable_s: float = 120.0
    crash_loop_after: int = 5

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.max_s < self.initial_s:
            raise ValueError("need 0 <= initial_s <= max_s")
        if self.factor < 1:
            raise ValueError("factor must be >= 1 (delays never shrink within a series)")
        if self.crash_loop_after < 1:
            raise ValueError("crash_loop_after must be >= 1")

    def delay(self, consecutive: int) -> float:
        """Seconds to wait before restarting after the ``consecutive``-th crash in a row (>= 1)."""
        if consecutive < 1:
            raise ValueError("consecutive counts crashes, so it starts at 1")
        # cap the exponent too: factor ** n overflows a float long before a process gives up
        exponent = min(consecutive - 1, 64)
        return float(min(self.max_s, self.initial_s * self.factor**exponent))


@dataclass(slots=True)
class RestartTracker:
    """One supervised process's restart history under a :class:`BackoffPolicy`."""

    policy: BackoffPolicy = field(default_factory=BackoffPolicy)
    #: Crashes since the last stable run (what the delay grows with).
    consecutive: int = 0
    #: Every restart since the supervisor started (what the logs and the summary count).
    total: int = 0

    def exited(self, ran_for_s: float) -> float:
        """Record an exit after ``ran_for_s`` seconds of running; return the delay before restarting."""
        if ran_for_s >= self.policy.stable_s:
            self.consecutive = 0
        self.consecutive += 1
        self.total += 1
        return self.policy.delay(self.consecutive)

    @property
    def crash_looping(self) -> bool:
        """True once the process has crashed ``crash_loop_after`` times in a row (CrashLoopBackOff)."""
        return self.consecutive >= self.policy.crash_loop_after
