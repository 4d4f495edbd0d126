"""The dev stack's port plan and its preflight: every port the stack will listen on, planned in one
place, free, and who holds it if not.

:class:`PortPlan` names every listener of the stack (the broker, its KRaft controller, each
group's web server, the dev chain). It is checked before anything starts, so ``avcc dev`` fails
within a second naming the port instead of letting a server die on ``AddrInUse`` while the stack
talks to whatever holds the port: two listeners the plan puts on one port
(:class:`PortPlanConflict`), or a planned port something else holds (:class:`PortInUse`). The
holder is looked up in ``/proc`` (Linux; only processes of the same user are visible): cheap, and
best effort (``None`` when it cannot be told). The banner names the plan.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from app.platform.errors import ConfigurationError

__all__ = ["PortClaim", "PortInUse", "PortPlan", "PortPlanConflict", "port_holders", "require_free_ports"]

#: ``/proc/net/tcp`` state of a listening socket (a merely bound one is not listed there at all).
_LISTEN = "0A"
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class PortClaim:
    """A TCP port the stack is about to listen on, and what for (named in the error)."""

    purpose: str
    host: str
    port: int


class PortInUse(ConfigurationError):
    """A port the dev stack needs is taken: stop what holds it or configure another port."""

    def __init__(self, busy: list[tuple[PortClaim, str | None]]) -> None:
        self.busy = busy
        lines = [
            f"port {claim.port} is already in use on {claim.host}, needed for {claim.purpose}"
            + (f"; held by {holder}" if holder else "")
            for claim, holder in busy
        ]
        super().__init__(
            "; ".join(lines) + ". Stop what holds it, or move the stack with AVCC_KAFKA_URL "
            "(broker port) / AVCC_WEB_PORT (web ports)."
        )


class PortPlanConflict(ConfigurationError):
    """Two listeners of the dev stack are planned on one port: move the stack's ports apart."""

    def __init__(self, clashes: list[tuple[PortClaim, PortClaim]]) -> None:
        self.clashes = clashes
        lines = [f"port {a.port} is planned for both {a.purpose} and {b.purpose}" for a, b in clashes]
        super().__init__(
            "; ".join(lines) + ". Move the stack with AVCC_KAFKA_URL (the broker's port; its KRaft "
            "controller listens on the next one) / AVCC_WEB_PORT (web ports)."
        )


@dataclass(frozen=True, slots=True)
class PortPlan:
    """Every TCP port a stack listens on, each named by what listens there."""

    claims: tuple[PortClaim, ...]

    def conflicts(self) -> list[tuple[PortClaim, PortClaim]]:
        """Pairs of listeners the plan puts on one port (of hosts that can clash)."""
        return [
            (first, second)
            for i, first in enumerate(self.claims)
            for second in self.claims[i + 1 :]
            if first.port == second.port and _clash(first.host, second.host)
        ]

    def check(self) -> None:
        """:class:`PortPlanConflict` when two listeners share a port, else :class:`PortInUse`
        naming every planned port that cannot be bound now."""
        clashes = self.conflicts()
        if clashes:
            raise PortPlanConflict(clashes)
        require_free_ports(self.claims)

    def describe(self) -> str:
        """The plan for the banner: one listener a line, ``host:port  what``."""
        return "\n".join(f"   {claim.host}:{claim.port:<6} {claim.purpose}" for claim in self.claims)


def _clash(first: str, second: str) -> bool:
    """Whether servers on ``first`` and ``second`` contend for a port (a wildcard meets every
    host; two addresses only when they are the same)."""
    return first == second or first in _WILDCARDS or second in _WILDCARDS


#: Hosts that bind every interface.
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def _bindable(claim: PortClaim) -> bool:
    """True when a server could bind ``claim`` now (``SO_REUSEADDR``, as servers bind)."""
    with socket.socket(socket.AF_INET6 if ":" in claim.host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((claim.host, claim.port))
        except OSError:
            return False
    return True


def _socket_inodes(port: int) -> set[str]:
    """Inodes of the sockets listening on local TCP ``port``."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) <= 9 or fields[3] != _LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def port_holders(port: int) -> dict[int, str]:
    """``{pid: command name}`` of the visible processes listening on local TCP ``port``."""
    inodes = {f"socket:[{inode}]" for inode in _socket_inodes(port)}
    holders: dict[int, str] = {}
    if not inodes:
        return holders
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                holders[int(entry.name)] = (entry / "comm").read_text().strip()
        except OSError:  # gone, or another user's process
            continue
    return holders


def _describe_holder(port: int) -> str | None:
    holders = port_holders(port)
    return ", ".join(f"pid {pid} ({name})" for pid, name in sorted(holders.items())) or None


def require_free_ports(claims: Iterable[PortClaim]) -> None:
    """Raise :class:`PortInUse` naming every claimed port that cannot be bound now."""
    busy = [(claim, _describe_holder(claim.port)) for claim in claims if not _bindable(claim)]
    if busy:
        raise PortInUse(busy)
