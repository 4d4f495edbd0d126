"""Whether a Kafka listener speaks TLS: the proof a plaintext client is pointed at a TLS port.

A plaintext client at a TLS listener gets no answer to its first request (the broker waits for
the rest of a "TLS record" that never comes) until librdkafka's 10 s ApiVersion timeout, and a
hung broker looks the same. One TLS handshake tells them apart at once: a TLS listener answers it
(with a certificate, or with an alert), a plaintext Kafka listener closes on it or stays silent.
"""

from __future__ import annotations

import socket
import ssl

__all__ = ["listener_speaks_tls"]


def _address(server: str) -> tuple[str, int]:
    host, _, port = server.strip().rpartition(":")
    return host.strip("[]"), int(port)


def listener_speaks_tls(bootstrap: str, timeout_s: float = 3.0) -> bool:
    """Whether the first bootstrap server that accepts a connection answers a TLS handshake
    (certificates not checked: only the protocol matters here)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    for server in bootstrap.split(","):
        host, port = _address(server)
        try:
            raw = socket.create_connection((host, port), timeout=timeout_s)
        except OSError:
            continue
        with raw:
            try:
                with context.wrap_socket(raw, server_hostname=host):
                    return True
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
                return False
            except ssl.SSLError as exc:
                return "ALERT" in (exc.reason or "")  # the peer sent a TLS alert; else garbage back
            except OSError:
                return False
    return False
