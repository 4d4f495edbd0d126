"""The dev stack's port plan and its preflight: every listener planned, a port planned twice
refused, a taken port named with its holder; free ports pass."""

from __future__ import annotations

import os
import socket

import pytest

from app.dev import port_plan
from app.platform.groups import GROUPS
from app.platform.settings import Settings
from app.supervisor.ports import PortClaim, PortInUse, PortPlanConflict, port_holders, require_free_ports
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


def test_the_dev_port_plan_puts_the_controller_next_to_the_broker_and_names_every_listener() -> None:
    settings = Settings(kafka_url="kafka://127.0.0.1:19092", web_port=30650)
    plan = port_plan(settings, list(GROUPS), start_broker=True, chain="evm")
    ports = {claim.purpose: claim.port for claim in plan.claims}
    assert ports["the embedded Kafka broker"] == 19092
    assert ports["the embedded Kafka broker's KRaft controller"] == 19093
    assert {ports[f"the web server of group {g.name}"] for g in GROUPS} == {
        30650 + g.port_offset for g in GROUPS
    }
    assert ports["the ganache dev chain"] == 18545
    assert plan.conflicts() == []
    assert all(f":{port}" in plan.describe() for port in ports.values())
    without_broker = port_plan(settings, list(GROUPS), start_broker=False, chain="local")
    assert 19093 not in {claim.port for claim in without_broker.claims}


def test_a_web_port_on_the_controller_port_is_refused_before_anything_listens() -> None:
    """AVCC_WEB_PORT=30650 once gave the embedded broker's controller (then drawn at random) the
    code group's port 30651: the code worker crash-looped on EADDRINUSE. Planned, a controller
    port that is a group's web port (the broker just below AVCC_WEB_PORT) is refused before
    anything starts, naming both listeners."""
    settings = Settings(kafka_url="kafka://127.0.0.1:30649", web_port=30650)
    plan = port_plan(settings, list(GROUPS), start_broker=True, chain="local")
    with pytest.raises(PortPlanConflict) as caught:
        plan.check()
    assert [(a.port, b.purpose) for a, b in caught.value.clashes] == [(30650, "the web server of group ops")]
    assert "port 30650 is planned for both the embedded Kafka broker's KRaft controller" in str(caught.value)
