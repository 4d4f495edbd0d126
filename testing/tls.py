"""A throwaway certificate authority and the certificates issued by it, for test servers.

Writes PEM files a JVM (Kafka's ``ssl.keystore.type=PEM``), librdkafka and Python's ``ssl`` all
read: a CA certificate, and a server key + certificate chain whose names cover loopback.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "ServerCertificate"]

_VALID_FOR = datetime.timedelta(days=2)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


@dataclass(frozen=True, slots=True)
class ServerCertificate:
    """A server's PEM files: ``keystore`` holds its key then its certificate (Kafka's PEM keystore)."""

    key: Path
    certificate: Path
    keystore: Path


class CertificateAuthority:
    """A self-signed CA kept in ``directory`` (``ca.pem``, ``ca.key``); it issues server certificates."""

    def __init__(self, directory: Path, common_name: str = "avcc test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.certificate_path = directory / "ca.pem"
        self.certificate_path.write_bytes(self._certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / "ca.key", self._key)

    def issue_server(
        self, name: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    ) -> ServerCertificate:
        """A server certificate for ``hosts`` (IP addresses or DNS names), signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        key_path = self.directory / f"{name}.key"
        cert_path = self.directory / f"{name}.pem"
        keystore = self.directory / f"{name}.keystore.pem"
        _write_key(key_path, key)
        chain = certificate.public_bytes(serialization.Encoding.PEM) + self._certificate.public_bytes(
            serialization.Encoding.PEM
        )
        cert_path.write_bytes(chain)
        keystore.write_bytes(key_path.read_bytes() + chain)
        keystore.chmod(0o600)
        return ServerCertificate(key_path, cert_path, keystore)
