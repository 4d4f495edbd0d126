"""listener_speaks_tls against real loopback listeners: TLS, TLS demanding a client certificate,
one that closes on a handshake like a plaintext Kafka listener, one that stays silent, none."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.platform.kafka.tls_probe import listener_speaks_tls
from testing.tls import CertificateAuthority


def _serve(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback listener running ``handle`` on each connection; yields its bootstrap."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def loop() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                handle(connection)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        server.close()


def _tls_handler(tmp_path: Path, require_client_cert: bool) -> Callable[[socket.socket], None]:
    ca = CertificateAuthority(tmp_path / "ca")
    server_cert = ca.issue_server("broker")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server_cert.certificate, server_cert.key)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(ca.certificate_path)

    def handle(connection: socket.socket) -> None:
        connection.settimeout(3)
        try:
            with context.wrap_socket(connection, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    return handle


@pytest.fixture
def tls_listener(tmp_path: Path) -> Iterator[str]:
    yield from _serve(_tls_handler(tmp_path, require_client_cert=False))


@pytest.fixture
def mtls_listener(tmp_path: Path) -> Iterator[str]:
    yield from _serve(_tls_handler(tmp_path, require_client_cert=True))


def _kafka_plaintext(connection: socket.socket) -> None:
    """A plaintext Kafka listener: the ClientHello's first 4 bytes read as a request size far
    above ``socket.request.max.bytes``, so it closes the connection."""
    connection.recv(4)


def _silent(connection: socket.socket) -> None:
    connection.recv(1024)
    threading.Event().wait(0.8)


def test_a_tls_listener_is_recognised(tls_listener: str) -> None:
    assert listener_speaks_tls(tls_listener)


def test_a_tls_listener_that_refuses_the_client_without_a_certificate_is_recognised(
    mtls_listener: str,
) -> None:
    assert listener_speaks_tls(mtls_listener)


def test_a_plaintext_kafka_listener_is_not_tls() -> None:
    for bootstrap in _serve(_kafka_plaintext):
        assert not listener_speaks_tls(bootstrap)


def test_a_silent_listener_is_not_tls() -> None:
    for bootstrap in _serve(_silent):
        assert not listener_speaks_tls(bootstrap, timeout_s=0.5)


def test_the_first_server_that_accepts_a_connection_is_asked(tls_listener: str) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    nobody = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    assert not listener_speaks_tls(nobody)
    assert listener_speaks_tls(f"{nobody},{tls_listener}")
