"""The real retry worker (``avcc worker retry``) on a broker of this module alone: it forwards
every due message of ``topic.system.retry``, so on a shared broker it would also redeliver what
other modules' workers left there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.platform.kafka.partitioner import partition_for
from app.platform.topics import DLQ, RETRY
from tests.integration.reads import read_range
from tests.integration.test_faults import (
    PARTITIONS,
    REPO_ROOT,
    Headers,
    _record,
    plan_topics,
    produce,
    read_topic,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: How long after the test's clock reading partition 0's head falls due; partition 1's message
#: must be forwarded before then (it must not wait behind that head), however loaded the box.
HEAD_DELAY_MS = 8000

RETRY_WORKER = r"""
from app.cli import main

main(["worker", "retry", "--without-web"])
"""


def test_retry_worker_holds_only_the_partition_whose_head_is_not_due(
    module_kafka: Any, tmp_path: Path, unique: str
) -> None:
    broker = module_kafka
    topic = f"test.retryfwd.{unique}"
    plan_topics(broker.bootstrap, (topic, PARTITIONS))
    out = tmp_path / "retry-worker"
    out.mkdir()
    script = out / "retry_worker.py"
    script.write_text(RETRY_WORKER)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "AVCC_KAFKA_URL": f"kafka://{broker.bootstrap}",
        "AVCC_DATA_DIR": str(out / "data"),
        "AVCC_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "AVCC_DEV_MODE": "true",
    }
    log_path = out / "worker.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script)], cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 45
        while "retry forwarder assigned" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        # keys on two different retry partitions
        key_a = next(k for k in (b"a%d" % i for i in range(100)) if partition_for(k, RETRY.partitions) == 0)
        key_b = next(k for k in (b"b%d" % i for i in range(100)) if partition_for(k, RETRY.partitions) == 1)
        now = int(time.time() * 1000)
        due_a = now + HEAD_DELAY_MS

        def headers(n: str, not_before: int | None, original: str | None = topic) -> Headers:
            h: Headers = [("trace-id", n.encode()), ("avcc-target-group", b"g" + unique.encode())]
            if original is not None:
                h += [("avcc-original-topic", original.encode()), ("avcc-original-partition", b"2")]
            if not_before is not None:
                h.append(("avcc-not-before-ms", str(not_before).encode()))
            return h

        lost = f"no-original-{unique}"
        produce(
            broker.bootstrap,
            RETRY.name,
            [
                (key_a, b"A1", headers("A1", due_a), 0),
                (key_a, b"A2", headers("A2", None), 0),  # parked behind A1: due at once, but after A1
                (key_b, b"B1", headers("B1", now), 1),
                (key_b, lost.encode(), headers("X", None, original=None), 1),
            ],
        )
        # the last message of each retry partition handled: X dead-lettered (partition 1), A2
        # forwarded (partition 0); then the topic read to its end holds all that was forwarded
        [dead] = read_topic(
            broker.bootstrap, DLQ.name, lambda r: r.value == lost.encode(), expected=1, timeout_s=60
        )
        read_topic(broker.bootstrap, topic, lambda r: r.value == b"A2", expected=1, timeout_s=60)
        got = [_record(m) for m in read_range(broker.bootstrap, topic)]
        by_value = {r.value: r for r in got}
        assert len(got) == 3 and set(by_value) == {b"A1", b"A2", b"B1"}
        a1, a2, b1 = by_value[b"A1"], by_value[b"A2"], by_value[b"B1"]
        assert {r.partition for r in got} == {2}  # the original partition
        assert b1.timestamp_ms < due_a, "partition 1 waited for partition 0's head"
        assert b1.timestamp_ms < a1.timestamp_ms
        assert a1.timestamp_ms >= due_a
        assert a2.offset > a1.offset  # in order within the retry partition
        assert a1.key == key_a and a1.header_list == headers("A1", due_a)  # unchanged, target included
        assert dead.header("trace-id") == "X"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0 or proc.returncode == -signal.SIGTERM, log_path.read_text(errors="replace")[
        -3000:
    ]
