"""Starting and stopping a test's or a bench's servers and workers side by side."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Protocol

from app.servers.process import ManagedProcess

__all__ = ["start_together", "stop_together"]


class _Stoppable(Protocol):
    def stop(self) -> Any: ...


def stop_together(members: Iterable[_Stoppable]) -> None:
    """``stop()`` every member at once, each in a thread, and wait for all (the first failure
    is raised after). A KRaft cluster stopped node by node loses its controller quorum after
    the first node, and each later node waits out its stop timeout for a controlled shutdown
    that can no longer complete; workers stopped one by one add up their shutdown times."""
    failures: list[BaseException] = []

    def stop(member: _Stoppable) -> None:
        try:
            member.stop()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=stop, args=(m,), name="stop-together") for m in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def start_together(members: Iterable[ManagedProcess]) -> None:
    """Launch every member, then wait until each is ready: they start side by side, so a stack
    of workers is up in about the time of its slowest one rather than the sum of them all."""
    started = list(members)
    for member in started:
        member.start(wait=False)
    for member in started:
        member.wait_ready()
