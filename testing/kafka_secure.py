"""Single-node Apache Kafka (KRaft) that requires SASL_SSL and authorizes every request by ACL.

What a production broker looks like to the pipeline's clients, on loopback: a TLS listener whose
certificate a throwaway CA signed (:mod:`testing.tls`), SCRAM-SHA-512 users, the standard
authorizer with ``allow.everyone.if.no.acl.found=false``. The controller listener is TLS too, with
its own PLAIN user; ``admin`` (inter-broker and the tests' administrator) and ``controller`` are
the only super users. Users beyond ``admin`` are added through the admin API (:meth:`add_user`).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from app.servers.kafka import KafkaKRaftBroker
from app.servers.process import LOOPBACK, port_is_open
from testing.tls import CertificateAuthority

__all__ = ["KafkaSecureBroker"]

ADMIN_USER = "admin"
_CONTROLLER_USER = "controller"
MECHANISM = "SCRAM-SHA-512"


def _jaas(module: str, **options: str) -> str:
    pairs = " ".join(f'{key}="{value}"' for key, value in options.items())
    return f"{module} required {pairs};"


class KafkaSecureBroker(KafkaKRaftBroker):
    """A :class:`KafkaKRaftBroker` with SASL_SSL listeners and the standard authorizer."""

    name = "kafka-secure"

    def __init__(self, data_dir: Path, libs_dir: Path | None = None, **kwargs: Any) -> None:
        super().__init__(data_dir, libs_dir, **kwargs)
        self.admin_password = secrets.token_urlsafe(18)
        self._controller_password = secrets.token_urlsafe(18)
        self.tls_dir = self.data_dir / "tls"
        self.ca: CertificateAuthority | None = None

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients trust (PEM)."""
        return self.tls_dir / "ca.pem"

    def client_config(self, user: str, password: str) -> dict[str, str]:
        """librdkafka settings of a client that logs in as ``user``."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": MECHANISM,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": str(self.ca_file),
        }

    def admin_config(self) -> dict[str, str]:
        """librdkafka settings of the super user ``admin``."""
        return self.client_config(ADMIN_USER, self.admin_password)

    def avcc_env(self, user: str, password: str) -> dict[str, str]:
        """The ``AVCC_KAFKA_*`` settings of a worker that logs in as ``user``."""
        return {
            "AVCC_KAFKA_URL": f"kafka://{self.bootstrap}",
            "AVCC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "AVCC_KAFKA_SASL_MECHANISM": MECHANISM,
            "AVCC_KAFKA_SASL_USERNAME": user,
            "AVCC_KAFKA_SASL_PASSWORD": password,
            "AVCC_KAFKA_SSL_CAFILE": str(self.ca_file),
        }

    def properties(self) -> dict[str, str]:
        """The plaintext broker's configuration with both listeners on SASL_SSL."""
        props = super().properties()
        tls = self.tls_dir
        props.update(
            {
                "listeners": f"BROKER://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}",
                "advertised.listeners": f"BROKER://{LOOPBACK}:{self.port}",
                "listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:SASL_SSL",
                "inter.broker.listener.name": "BROKER",
                "sasl.enabled.mechanisms": MECHANISM,
                "sasl.mechanism.inter.broker.protocol": MECHANISM,
                "sasl.mechanism.controller.protocol": "PLAIN",
                "listener.name.broker.sasl.enabled.mechanisms": MECHANISM,
                "listener.name.broker.scram-sha-512.sasl.jaas.config": _jaas(
                    "org.apache.kafka.common.security.scram.ScramLoginModule",
                    username=ADMIN_USER,
                    password=self.admin_password,
                ),
                "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
                "listener.name.controller.plain.sasl.jaas.config": _jaas(
                    "org.apache.kafka.common.security.plain.PlainLoginModule",
                    username=_CONTROLLER_USER,
                    password=self._controller_password,
                    **{f"user_{_CONTROLLER_USER}": self._controller_password},
                ),
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(tls / "kafka.keystore.pem"),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(tls / "ca.pem"),
                "ssl.client.auth": "none",
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "allow.everyone.if.no.acl.found": "false",
                "super.users": f"User:{ADMIN_USER};User:{_CONTROLLER_USER}",
            }
        )
        props.update(self.extra_properties)
        return props

    def _prepare(self) -> None:
        if self.ca is None:
            self.ca = CertificateAuthority(self.tls_dir)
            self.ca.issue_server("kafka")
        super()._prepare()
        self.config_path.chmod(0o600)  # it holds the super users' passwords

    def _format_args(self) -> list[str]:
        return ["--add-scram", f"{MECHANISM}=[name={ADMIN_USER},password={self.admin_password}]"]

    def _probe(self) -> bool:
        if not port_is_open(LOOPBACK, self.port):
            return False
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({**self.admin_config(), "log_level": 0, "socket.timeout.ms": 2000})
        metadata = admin.list_topics(timeout=2.0)
        return bool(metadata.brokers)

    def add_user(self, user: str, password: str) -> None:
        """Create (or reset) the SCRAM credentials of ``user``, as ``admin``."""
        from confluent_kafka.admin import (
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        admin = AdminClient(self.admin_config())
        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
        )
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
