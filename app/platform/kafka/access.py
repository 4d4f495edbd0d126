"""A worker's start-up check of its access to Kafka: it can log in, and its principal holds the
grants its group needs (:mod:`app.platform.kafka.acls`).

Without it, a worker given a wrong password, an untrusted CA, a plaintext client pointed at a TLS
port or a principal short of one ACL starts anyway and spins: the Kafka clients retry such errors
for ever, in log lines nobody connects to the cause. Here each of them ends the worker at start
with one message saying what is wrong and what to change, and a non-zero exit status; a broker
that is only not up yet is waited for, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from app.platform.errors import ConfigurationError
from app.platform.faust.app import consumer_group_id
from app.platform.groups import GroupSpec
from app.platform.kafka.acls import AclGrant, acl_plan, group_principal
from app.platform.kafka.tls_probe import listener_speaks_tls
from app.platform.settings import Settings

__all__ = [
    "EXIT_KAFKA_LOGIN_REFUSED",
    "EXIT_KAFKA_UNAVAILABLE",
    "EXIT_NOT_AUTHORIZED",
    "KafkaAccessRefused",
    "check_kafka_access",
    "missing_grants",
    "refused_by_acl",
]

log = logging.getLogger(__name__)

#: Exit status of a worker whose principal lacks a grant (sysexits' EX_NOPERM).
EXIT_NOT_AUTHORIZED: Final = 77
#: Exit status of a worker that cannot log in: credentials, TLS trust, security protocol (EX_CONFIG).
EXIT_KAFKA_LOGIN_REFUSED: Final = 78
#: Exit status of a worker whose broker did not answer within :data:`CONNECT_WAIT_S` (EX_UNAVAILABLE).
EXIT_KAFKA_UNAVAILABLE: Final = 69
#: How long a starting worker waits for a broker that does not answer (restarting, not up yet)
#: before it exits for its supervisor to start it again.
CONNECT_WAIT_S: Final = 120.0

#: Text librdkafka logs when a TLS client meets a plaintext listener.
_PROTOCOL_HINT: Final = "security.protocol"
#: A plaintext client at a TLS listener is closed on before the broker answers its first request
#: (the broker took the request for a TLS handshake); a broker that is not up refuses the connection.
_CLOSED_BEFORE_ANSWER: Final = "in state APIVERSION_QUERY"
_CLOSED_BEFORE_ANSWER_TIMES: Final = 3
#: How long a plaintext client waits for a first answer before it checks whether the listener
#: speaks TLS, and how often it checks again while there is no answer.
_TLS_PROBE_AFTER_S: Final = 2.0
_TLS_PROBE_EVERY_S: Final = 10.0
_FATAL_CODES: Final = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
_REQUEST_S: Final = 15.0


class KafkaAccessRefused(ConfigurationError):
    """The worker cannot work with these settings (the broker refuses its credentials or its
    ACLs); ``exit_code`` says which kind of refusal. Fix the credentials or the ACLs and restart."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(slots=True)
class _Reasons:
    """What librdkafka reported while the check tried to connect (errors and connection logs)."""

    fatal: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def on_error(self, error: KafkaError) -> None:
        if error.code() in _FATAL_CODES:
            self.fatal.append(error.str())

    def on_log(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "FAIL" in text or _PROTOCOL_HINT in text:
            self.failures.append(text)

    def protocol_mismatch(self) -> str | None:
        hint = next((f for f in self.failures if _PROTOCOL_HINT in f), None)
        if hint is not None:
            return hint
        closed = [f for f in self.failures if _CLOSED_BEFORE_ANSWER in f]
        if len(closed) >= _CLOSED_BEFORE_ANSWER_TIMES:
            return f"the broker closes every connection before answering the first request ({closed[-1]})"
        return None


class _Capture(logging.Handler):
    def __init__(self, sink: Callable[[logging.LogRecord], None]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink(record)


def _principal(settings: Settings) -> str:
    return f"User:{settings.kafka_sasl_username}" if settings.kafka_sasl_username else "the client"


def _another_protocol(where: str, settings: Settings, detail: str) -> KafkaAccessRefused:
    """The refusal for a listener that does not speak ``AVCC_KAFKA_SECURITY_PROTOCOL``."""
    return KafkaAccessRefused(
        f"{where}: the broker's listener speaks another protocol than "
        f"AVCC_KAFKA_SECURITY_PROTOCOL={settings.kafka_security_protocol}: {detail}",
        EXIT_KAFKA_LOGIN_REFUSED,
    )


def _connected_admin(
    settings: Settings, *, wait_s: float = CONNECT_WAIT_S, wait_log_s: float = 10.0
) -> AdminClient:
    """An admin client that has fetched metadata; ``KafkaAccessRefused`` on a login refusal, or
    when the broker has not answered within ``wait_s``."""
    reasons = _Reasons()
    librdkafka_log = logging.getLogger("avcc.kafka.access.librdkafka")
    librdkafka_log.propagate = False
    librdkafka_log.setLevel(logging.DEBUG)
    capture = _Capture(reasons.on_log)
    librdkafka_log.addHandler(capture)
    admin = AdminClient(
        {**settings.kafka_client_config(), "error_cb": reasons.on_error, "logger": librdkafka_log}
    )
    where = f"Kafka at {settings.kafka_bootstrap} ({settings.kafka_security_protocol})"
    started = time.monotonic()
    next_log = started + wait_log_s
    next_probe = started + _TLS_PROBE_AFTER_S if "SSL" not in settings.kafka_security_protocol else None
    try:
        while True:
            try:
                admin.list_topics(timeout=2.0)
                return admin
            except KafkaException:
                admin.poll(0.1)
            if reasons.fatal:
                raise KafkaAccessRefused(
                    f"{where} refused {_principal(settings)}: {reasons.fatal[-1]}", EXIT_KAFKA_LOGIN_REFUSED
                )
            mismatch = reasons.protocol_mismatch()
            if mismatch is not None:
                raise _another_protocol(where, settings, mismatch)
            last = reasons.failures[-1] if reasons.failures else "no answer"
            now = time.monotonic()
            if next_probe is not None and now >= next_probe:
                next_probe = now + _TLS_PROBE_EVERY_S
                if listener_speaks_tls(settings.kafka_bootstrap):
                    tls = "it answers a TLS handshake (use SSL or SASL_SSL)"
                    raise _another_protocol(where, settings, tls)
            if now - started >= wait_s:
                raise KafkaAccessRefused(
                    f"{where} did not answer within {wait_s:.0f} s: {last}", EXIT_KAFKA_UNAVAILABLE
                )
            if now >= next_log:
                log.warning("waiting for %s: %s", where, last)
                next_log = now + wait_log_s
    finally:
        librdkafka_log.removeHandler(capture)


def _authorized(admin: AdminClient, grants: list[AclGrant]) -> dict[tuple[str, str], set[str] | None]:
    """For each (resource type, name) of ``grants``: the operations the caller may do there,
    ``set()`` when refused outright, ``None`` when the broker does not say (no authorizer, or a
    topic that does not exist yet)."""
    topics = sorted({g.resource_name for g in grants if g.resource_type == "TOPIC"})
    groups = sorted({g.resource_name for g in grants if g.resource_type == "GROUP"})
    found: dict[tuple[str, str], set[str] | None] = {}
    for name, future in admin.describe_topics(
        TopicCollection(topics), include_authorized_operations=True, request_timeout=_REQUEST_S
    ).items():
        found[("TOPIC", name)] = _operations(future, "TOPIC")
    for name, future in admin.describe_consumer_groups(
        groups, include_authorized_operations=True, request_timeout=_REQUEST_S
    ).items():
        found[("GROUP", name)] = _operations(future, "GROUP")
    return found


def _operations(future: Future[Any], resource_type: str) -> set[str] | None:
    """The operations a described resource's answer grants (see :func:`_authorized`)."""
    refused = (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
        if resource_type == "TOPIC"
        else KafkaError.GROUP_AUTHORIZATION_FAILED
    )
    try:
        description = future.result(timeout=_REQUEST_S)
    except KafkaException as exc:
        if exc.args[0].code() == refused:
            return set()
        return None
    operations = description.authorized_operations
    return None if operations is None else {op.name for op in operations}


def missing_grants(admin: AdminClient, spec: GroupSpec) -> list[AclGrant]:
    """The grants of ``spec``'s group (on named topics and on its consumer group) that the caller's
    principal lacks, by the broker's own answer; prefixed grants are checked where used."""
    own_group = consumer_group_id(spec.name)
    wanted = [
        g
        for g in acl_plan([spec])
        if g.pattern_type == "LITERAL" or (g.resource_type == "GROUP" and g.resource_name == own_group)
    ]
    authorized = _authorized(admin, wanted)
    missing: list[AclGrant] = []
    for grant in wanted:
        operations = authorized.get((grant.resource_type, grant.resource_name))
        if operations is not None and grant.operation not in operations and "ALL" not in operations:
            missing.append(grant)
    return missing


def check_kafka_access(settings: Settings, spec: GroupSpec) -> None:
    """Connect as the worker will, then (on a secured broker) check its group's grants.

    Raises :class:`KafkaAccessRefused` naming the cause; waits while the broker does not answer.
    """
    admin = _connected_admin(settings)
    if settings.kafka_security_protocol == "PLAINTEXT":
        return
    missing = missing_grants(admin, spec)
    if missing:
        who = _principal(settings)
        lines = [f"group {spec.name}: Kafka refuses {who} what the group needs:"]
        for grant in missing:
            lines.append(
                f"  {grant.operation} on {grant.resource_type.lower()} {grant.resource_name!r} "
                f"(ACL: ALLOW {grant.principal} {grant.operation} {grant.resource_type} "
                f"{grant.pattern_type} {grant.resource_name})"
            )
        lines.append(
            f"run this worker as {group_principal(spec.name)}, or create the group's ACLs with "
            "`avcc kafka acls apply` (as the broker's administrator)"
        )
        raise KafkaAccessRefused("\n".join(lines), EXIT_NOT_AUTHORIZED)


_ACL_CODES: Final = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)


def refused_by_acl(exc: BaseException, settings: Settings, spec: GroupSpec) -> KafkaAccessRefused | None:
    """``exc`` as a :class:`KafkaAccessRefused` when the broker refused it by ACL (creating or
    checking the group's internal topics at start), else ``None``."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(error, KafkaError) or error.code() not in _ACL_CODES:
        return None
    return KafkaAccessRefused(
        f"group {spec.name}: Kafka refuses {_principal(settings)} ({error.str()}) while creating or "
        f"checking the group's topics; its internal topics need the grants on the prefix "
        f"'{consumer_group_id(spec.name)}-' (`avcc kafka acls plan --group {spec.name}`)",
        EXIT_NOT_AUTHORIZED,
    )
