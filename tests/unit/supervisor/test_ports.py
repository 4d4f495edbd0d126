"""Port preflight: a taken port is named with its holder; free ports pass."""

from __future__ import annotations

import os
import socket

import pytest

from app.supervisor.ports import PortClaim, PortInUse, port_holders, require_free_ports
from testing.ports import free_port


def test_free_ports_pass() -> None:
    claims = [PortClaim("broker", "127.0.0.1", free_port()), PortClaim("web", "127.0.0.1", free_port())]
    require_free_ports(claims)


@pytest.mark.parametrize("listen", [True, False], ids=["listening", "bound-only"])
def test_a_taken_port_is_named_with_its_purpose_and_holder(listen: bool) -> None:
    taken, free = free_port(), free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        if listen:
            holder.listen()
        with pytest.raises(PortInUse) as caught:
            require_free_ports(
                [PortClaim("the broker", "127.0.0.1", taken), PortClaim("a web server", "127.0.0.1", free)]
            )
        # Linux lists only listening (and connected) sockets in /proc/net/tcp: a socket that
        # is merely bound blocks the port but has no visible holder
        assert (os.getpid() in port_holders(taken)) is listen
    message = str(caught.value)
    assert f"port {taken} is already in use on 127.0.0.1, needed for the broker" in message
    assert (f"held by pid {os.getpid()} (" in message) is listen
    assert str(free) not in message
    assert [claim.port for claim, _ in caught.value.busy] == [taken]


def test_a_wildcard_listener_blocks_the_loopback_port() -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", port))
        holder.listen()
        with pytest.raises(PortInUse, match=str(port)):
            require_free_ports([PortClaim("web", "127.0.0.1", port)])


def test_nobody_holds_a_free_port() -> None:
    assert port_holders(free_port()) == {}
