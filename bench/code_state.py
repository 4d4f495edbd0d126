"""The code group's tables at scale: real records as templates, the changelogs filled alike.

A registry's code group holds, per work, one ``records`` entry (the whole :class:`RecordState`:
application facts, review, chain receipt, AVCC code, history, seen event ids) and one ``claims``
entry (content hash -> record). Running a million works through the lifecycle would take hours,
so the benches and the recovery tests build that state in two steps:

1. a few thousand works go through the real pipeline (HTTP apply -> review -> chain -> code
   issued), so the code worker writes its own changelog entries;
2. the issued records it wrote are read back from the ``records`` changelog and used as
   templates: each synthetic work is a copy of a template, with its own record id (from the
   claims-id scheme, in a range no real claim reaches), content hash, request id, event ids,
   transaction hash and AVCC code (issued by :func:`issue_code`, as the worker does), produced
   to the same changelog partitions the worker would have written it to (the record key's
   murmur2 partition; the content hash's for its claim), in the worker's own byte format.

The filled changelogs therefore read back exactly like a registry that issued ``N`` works.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from app.lifecycle.code.avcc_code import issue_code
from app.lifecycle.code.claims import CLAIM_SLOTS, EVENT_NS, record_id_for
from app.lifecycle.code.records import apply_created, review_finished, tx_confirmed
from app.platform.kafka.partitioner import partition_for, record_key
from app.platform.topics import APPLY_CREATED, CODE_CLAIMS
from schemas.apply import AiToolInfo, ApplyCreated
from schemas.chain import ChainTxConfirmed
from schemas.envelope import make_envelope
from schemas.review import ReviewTaskFinished

__all__ = [
    "CLAIMS_CHANGELOG",
    "RECORDS_CHANGELOG",
    "SYNTHETIC_OFFSET",
    "FilledWork",
    "fill_changelogs",
    "issued_templates",
    "lifecycle_templates",
    "read_changelog",
    "synthetic_works",
]

RECORDS_CHANGELOG = "avcc-code-records-changelog"
CLAIMS_CHANGELOG = "avcc-code-claims-changelog"
#: First claims-topic offset of the synthetic works' record ids (real claim requests of a bench
#: or a test stay far below it), so a synthetic id never equals a real one.
SYNTHETIC_OFFSET = 50_000_000


def read_changelog(
    bootstrap: str, topic: str, timeout_s: float = 60.0, value_of: Callable[[bytes], Any] = bytes
) -> dict[bytes, Any]:
    """``value_of`` the latest value of every key of ``topic`` (tombstones drop the key), read to
    its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-read-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends: dict[int, int] = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        latest: dict[bytes, Any] = {}
        pending = set(ends)
        while pending:
            for message in consumer.consume(10_000, timeout=min(1.0, timeout_s)):
                if message.error():
                    continue
                key, value = message.key(), message.value()
                if value is None:
                    latest.pop(key, None)
                else:
                    latest[key] = value_of(value)
                if message.offset() + 1 >= ends[message.partition()]:
                    pending.discard(message.partition())
        return latest
    finally:
        consumer.close()


def lifecycle_templates(count: int, org: str, node: str) -> list[dict[str, Any]]:
    """``count`` issued records made by the code group's own transitions (apply.created, an
    approving O-level review, a successful copyright_main receipt), as the worker stores them:
    templates without running the pipeline (the recovery tests)."""
    templates = []
    for index in range(count):
        record_id = record_id_for(index, 0, 0)
        content_hash = f"sha256:{index:064x}"
        created = ApplyCreated(
            request_id=f"req_template_{index}",
            avcc_record_id=record_id,
            content_url="s3://aigc-hub-storage/works/raw/template.mp4",
            content_hash=content_hash,
            ai_tool_info=AiToolInfo(model_name="Stable-Diffusion-XL", model_version="v1.0"),
            priority=9,
            title="template work",
            applicant_id="template",
        )
        review = ReviewTaskFinished(
            request_id=created.request_id,
            avcc_record_id=record_id,
            review_report_id=record_id,
            decision="approved",
            final_level="O",
            overall_score=96.5,
            report_hash=f"sha256:{index + 1:064x}",
        )
        receipt = ChainTxConfirmed(
            avcc_record_id=record_id,
            chain_type="copyright_main",
            tx_hash=f"0x{index:064x}",
            block_height=1 + index // 100,
            status="success",
            crd_address="0x" + "a9" * 20,
            idempotency_key=f"copyright_main:{record_id}",
        )
        at = 1_796_000_000_000 + index * 1000
        state = apply_created(None, make_envelope(created, source="code-svc"), at, org, node)
        state = review_finished(state, make_envelope(review, source="review-svc"), at + 350, org, node)
        state = tx_confirmed(state, make_envelope(receipt, source="chain-svc"), at + 550, org, node)
        templates.append(orjson.loads(state.model_dump_json()))
    return templates


def issued_templates(records: dict[bytes, bytes]) -> list[dict[str, Any]]:
    """The issued records among a ``records`` changelog's values, as dicts (the templates)."""
    templates = [orjson.loads(v) for v in records.values()]
    issued = [t for t in templates if t.get("avcc_code")]
    if not issued:
        raise RuntimeError("no issued record to copy: run works through the lifecycle first")
    return issued


@dataclass(frozen=True, slots=True)
class FilledWork:
    """One synthetic work: its two changelog entries and their partitions."""

    record_id: int
    avcc_code: str
    record_partition: int
    record_value: bytes
    content_hash: str
    claim_partition: int
    claim_value: bytes


def _event_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def synthetic_works(
    templates: list[dict[str, Any]], count: int, org: str, node: str, first: int = 0
) -> Iterator[FilledWork]:
    """``count`` works copied from ``templates`` (round robin), each with its own identity: the
    ``first``-th to the ``first + count - 1``-th of a run (the same index, the same work)."""
    rng = random.Random(first)
    record_partitions = APPLY_CREATED.partitions
    claim_partitions = CODE_CLAIMS.partitions
    for index in range(first, first + count):
        template = templates[index % len(templates)]
        content_hash = f"sha256:{rng.getrandbits(256):064x}"
        claim_partition = partition_for(content_hash.encode(), claim_partitions)
        offset, slot = divmod(index, CLAIM_SLOTS)
        record_id = record_id_for(SYNTHETIC_OFFSET + offset, slot, claim_partition)
        code = issue_code(record_id, content_hash, org, node)
        request_id = f"req_{rng.getrandbits(48):012x}"
        ids = {
            "apply.created": str(uuid.uuid5(EVENT_NS, f"apply.created:{record_id}")),
        }
        history = []
        for entry in template.get("history", ()):
            event_id = ids.get(entry["event"]) or _event_id(rng)
            history.append({**entry, "event_id": event_id})
        record = {
            **template,
            "avcc_record_id": record_id,
            "request_id": request_id,
            "content_hash": content_hash,
            "avcc_code": code,
            "tx_hash": f"0x{rng.getrandbits(256):064x}",
            "history": history,
            "seen": {entry["event_id"]: entry["at_ms"] for entry in history},
        }
        claim = {
            "avcc_record_id": record_id,
            "request_id": request_id,
            "claimed_ms": template.get("created_ms"),
        }
        yield FilledWork(
            record_id=record_id,
            avcc_code=code,
            record_partition=partition_for(record_key(record_id), record_partitions),
            record_value=orjson.dumps(record),
            content_hash=content_hash,
            claim_partition=claim_partition,
            claim_value=orjson.dumps(claim),
        )


def fill_changelogs(
    bootstrap: str, works: Iterator[FilledWork], sample_every: int = 1000
) -> tuple[int, list[FilledWork]]:
    """Produce every work's ``records`` and ``claims`` entries (acks=all, idempotent, as the
    worker's changelog writes); the count, and every ``sample_every``-th work (to check later)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 500_000,
        }
    )
    count = 0
    samples: list[FilledWork] = []
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    for work in works:
        for topic, key, value, partition in (
            (RECORDS_CHANGELOG, record_key(work.record_id), work.record_value, work.record_partition),
            (CLAIMS_CHANGELOG, work.content_hash.encode(), work.claim_value, work.claim_partition),
        ):
            while True:
                try:
                    producer.produce(topic, value, key, partition=partition, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
        if count % sample_every == 0:
            samples.append(work)
        count += 1
    if producer.flush(120):
        raise RuntimeError("changelog fill: messages still unacknowledged after 120 s")
    if failures:
        raise RuntimeError(f"changelog fill: {len(failures)} deliveries failed, first: {failures[0]}")
    return count, samples
