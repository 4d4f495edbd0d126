"""Port preflight for the dev stack: is every port it will listen on free, and who holds it if not.

Checked before anything starts, so ``avcc dev`` fails within a second naming the port instead of
letting a server die on ``AddrInUse`` while the stack talks to whatever holds the port. The
holder is looked up in ``/proc`` (Linux; only processes of the same user are visible): cheap,
and best effort (``None`` when it cannot be told).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from app.platform.errors import ConfigurationError

__all__ = ["PortClaim", "PortInUse", "port_holders", "require_free_ports"]

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
