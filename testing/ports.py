"""Free TCP ports for the servers and workers a test or a bench starts: drawn at random, never
handed out twice in one process."""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterable
from pathlib import Path

from app.servers.process import LOOPBACK

__all__ = ["free_port", "free_port_block"]

_ports_lock = threading.Lock()
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that is free now and was not handed out before.

    Ports are drawn below the kernel's ephemeral range when possible, so outgoing client
    connections cannot grab a server's port while that server is being restarted.
    """
    low, _ = _ephemeral_range()
    with _ports_lock:
        if low > 12000:
            for _ in range(200):
                port = random.randrange(10000, low)
                if port not in _handed_out and _bindable(host, port):
                    _handed_out.add(port)
                    return port
        for _ in range(200):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError(f"could not find a free TCP port on {host}")


def free_port_block(offsets: Iterable[int], host: str = LOOPBACK) -> int:
    """A base port such that ``base + offset`` is free on ``host`` for every offset (a stack
    whose processes listen at fixed offsets from one port, like ``avcc dev``)."""
    wanted = sorted(set(offsets))
    for _ in range(200):
        base = free_port(host)
        if all(_bindable(host, base + o) and base + o not in _handed_out for o in wanted if o):
            with _ports_lock:
                _handed_out.update(base + o for o in wanted)
            return base
    raise RuntimeError(f"could not find {len(wanted)} free TCP ports at fixed offsets on {host}")
