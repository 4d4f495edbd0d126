"""Every group on a broker that requires SASL_SSL and authorizes by ACL, each as its own principal.

The broker (:class:`~testing.kafka_secure.KafkaSecureBroker`) has a CA of its own, SCRAM-SHA-512
users and ``allow.everyone.if.no.acl.found=false``. The topics and the ACLs are created the way an
operator would, with ``avcc topics apply`` and ``avcc kafka acls apply`` as its administrator.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from app.platform.faust.app import consumer_group_id
from app.platform.groups import GROUPS
from app.platform.http.auth import sign_request
from app.platform.kafka.access import EXIT_KAFKA_LOGIN_REFUSED, EXIT_NOT_AUTHORIZED
from app.platform.kafka.acls import acl_plan
from testing.kafka_secure import ADMIN_USER, KafkaSecureBroker
from testing.tls import CertificateAuthority
from tests.integration.stack import (
    API_KEY,
    API_SECRET,
    Stack,
    application,
    issued_exactly_once,
    run_avcc,
    wait_for,
)

#: How long a refused worker may take to exit (module imports, one connection, one describe).
REFUSAL_S = 90.0


@dataclass
class Secured:
    """The secured broker with its topics, its ACLs and one user per group."""

    broker: KafkaSecureBroker
    passwords: dict[str, str]
    first_apply: str

    def login(self, group: str) -> dict[str, str]:
        """The ``AVCC_KAFKA_*`` settings of ``group``'s own principal."""
        user = consumer_group_id(group)
        return self.broker.avcc_env(user, self.passwords[group])

    def admin_env(self) -> dict[str, str]:
        return self.broker.avcc_env(ADMIN_USER, self.broker.admin_password)


@pytest.fixture(scope="module")
def secured(module_secure_kafka: KafkaSecureBroker) -> Secured:
    broker = module_secure_kafka
    admin = broker.avcc_env(ADMIN_USER, broker.admin_password)
    topics = run_avcc(["topics", "apply"], admin)
    assert topics.returncode == 0, topics.stdout + topics.stderr
    acls = run_avcc(["kafka", "acls", "apply"], admin)
    assert acls.returncode == 0, acls.stdout + acls.stderr
    passwords = {group.name: secrets.token_urlsafe(18) for group in GROUPS}
    for group, password in passwords.items():
        broker.add_user(consumer_group_id(group), password)
    return Secured(broker, passwords, acls.stdout)


def test_acls_apply_creates_the_plan_once(secured: Secured) -> None:
    plan = acl_plan()
    assert f"{len(plan)} grants planned, {len(plan)} created, 0 beyond the plan" in secured.first_apply
    again = run_avcc(["kafka", "acls", "apply"], secured.admin_env())
    assert again.returncode == 0, again.stderr
    assert f"{len(plan)} grants planned, 0 created, 0 beyond the plan" in again.stdout
    admin = AdminClient(secured.broker.admin_config())
    every = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    bindings = admin.describe_acls(every, request_timeout=30).result(timeout=30)
    print(f"ACLs on the broker: {len(bindings)}, planned: {len(plan)}")
    assert len(bindings) == len(plan)


def _refused(secured: Secured, group: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = run_avcc(["worker", group], env, timeout=REFUSAL_S)
    for password in (*secured.passwords.values(), secured.broker.admin_password):
        assert password not in done.stdout + done.stderr, "a password is in the worker's output"
    return done


def test_a_gateway_principal_may_not_read_the_dlq(secured: Secured, tmp_path: Path) -> None:
    env = {**secured.login("gateway"), "AVCC_DATA_DIR": str(tmp_path)}
    done = _refused(secured, "ops", env)
    assert done.returncode == EXIT_NOT_AUTHORIZED, done.stderr
    assert "Kafka refuses User:avcc-gateway" in done.stderr
    assert "READ on topic 'topic.system.dlq'" in done.stderr
    assert "ALLOW User:avcc-ops READ TOPIC LITERAL topic.system.dlq" in done.stderr


def test_a_sink_principal_may_not_write_the_playback_topic(secured: Secured, tmp_path: Path) -> None:
    env = {**secured.login("sink"), "AVCC_DATA_DIR": str(tmp_path)}
    done = _refused(secured, "gateway", env)
    assert done.returncode == EXIT_NOT_AUTHORIZED, done.stderr
    assert "WRITE on topic 'topic.playback.event'" in done.stderr
    assert "ALLOW User:avcc-gateway WRITE TOPIC LITERAL topic.playback.event" in done.stderr


@pytest.mark.parametrize("case", ["wrong password", "untrusted CA", "plaintext client"])
def test_a_login_the_broker_refuses_ends_the_worker_at_start(
    secured: Secured, tmp_path: Path, case: str
) -> None:
    env = {**secured.login("code"), "AVCC_DATA_DIR": str(tmp_path)}
    wrong = f"wrong-{uuid.uuid4().hex}"
    expected = {
        "wrong password": "Authentication failed",
        "untrusted CA": "certificate verify failed",
        "plaintext client": "speaks another protocol than AVCC_KAFKA_SECURITY_PROTOCOL=PLAINTEXT",
    }[case]
    if case == "wrong password":
        env["AVCC_KAFKA_SASL_PASSWORD"] = wrong
    elif case == "untrusted CA":
        env["AVCC_KAFKA_SSL_CAFILE"] = str(CertificateAuthority(tmp_path / "other-ca").certificate_path)
    else:
        for key in ("AVCC_KAFKA_SASL_MECHANISM", "AVCC_KAFKA_SASL_USERNAME", "AVCC_KAFKA_SASL_PASSWORD"):
            env.pop(key)
        env["AVCC_KAFKA_SECURITY_PROTOCOL"] = "PLAINTEXT"
    done = _refused(secured, "code", env)
    assert wrong not in done.stdout + done.stderr
    assert done.returncode == EXIT_KAFKA_LOGIN_REFUSED, done.stderr
    assert expected in done.stderr, done.stderr


def _playback_batch(marker: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "avcc_code": f"MA.156.10005.8361/SE{marker}{i:04d}",
            "platform_node": "8361",
            "user_hash": "sha256:" + hashlib.sha256(f"{marker}-{i}".encode()).hexdigest(),
            "event_type": "play",
            "duration_sec": 30,
            "revenue_cny": "0.00",
        }
        for i in range(count)
    ]


def _stats(stack: Stack, avcc_code: str) -> dict[str, Any]:
    path = f"/v1/playback/stats?avcc_code={avcc_code}"
    request = urllib.request.Request(
        stack.url("sink") + path, headers=sign_request("GET", path, b"", API_KEY, API_SECRET)
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body: dict[str, Any] = orjson.loads(response.read())
    return body


@pytest.fixture(scope="module")
def secured_stack(secured: Secured, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("secured-stack")
    stack = Stack(
        secured.broker.bootstrap,
        root,
        env={"AVCC_SINK_BATCH_MAX_SECONDS": "0.5"},
        group_env={group.name: secured.login(group.name) for group in GROUPS},
    )
    try:
        stack.start(*(group.name for group in GROUPS))
        yield stack
    finally:
        stack.stop_all()


def test_every_group_runs_end_to_end_as_its_own_principal(secured_stack: Stack) -> None:
    stack = secured_stack
    status, answer = asyncio.run(stack.call("code", "POST", "/v1/avcc/applications", application()))
    assert status == 202, answer
    records = asyncio.run(issued_exactly_once(stack, [answer["avcc_record_id"]]))
    print(f"issued over SASL_SSL: {records[0]['avcc_code']}")

    marker = uuid.uuid4().hex[:6]
    batch = _playback_batch(marker, 5)
    json_body = {"Content-Type": "application/json"}
    status, accepted = asyncio.run(
        stack.call("gateway", "POST", "/v1/playback/events", batch, headers=json_body)
    )
    assert status == 202 and accepted["accepted"] == len(batch), accepted
    for item in batch:
        counted = wait_for(lambda code=item["avcc_code"]: _stats(stack, code)["events"] == 1 or None, 120)
        assert counted
    totals = [_stats(stack, item["avcc_code"])["events"] for item in batch]
    print(f"playback events counted over SASL_SSL: {sum(totals)} of {len(batch)}")
    assert totals == [1] * len(batch)
    exited = {name: p.returncode for (name, _), p in stack.workers.items() if p.returncode is not None}
    assert exited == {}, f"workers exited: {exited}\n{stack.logs()}"
    assert "AUTHORIZATION_FAILED" not in stack.logs()
