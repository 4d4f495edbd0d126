"""``send_many_nowait`` enqueues in order and stops where librdkafka's own queue is full, so the
gateway can answer exactly which items were produced (the rest get 429 and are sent again)."""

from __future__ import annotations

from app.platform.kafka.producers import PROFILES, EventProducer
from app.platform.settings import Settings

#: A loopback port nothing listens on: every message stays in the client's queue.
NOWHERE = Settings(kafka_url="kafka://127.0.0.1:9")


def test_enqueues_until_the_local_queue_is_full_and_says_how_many() -> None:
    room = int(PROFILES["playback"]["queue.buffering.max.messages"])
    producer = EventProducer(NOWHERE, "playback")
    try:
        values = [b"v%d" % n for n in range(room + 50)]
        keys = [b"k%d" % n for n in range(room + 50)]
        assert producer.send_many_nowait("t", values[:10], keys[:10]) == 10
        assert producer.send_many_nowait("t", values[10:], keys[10:]) == room - 10
        assert producer.send_many_nowait("t", values[:1], keys[:1]) == 0
    finally:
        producer._producer.purge(in_queue=True, in_flight=True)
        producer.close(timeout_s=0.1)


def test_a_refused_message_stops_the_batch_where_it_is() -> None:
    producer = EventProducer(NOWHERE, "playback")
    try:
        too_big = b"x" * (2 * 1024 * 1024)  # over librdkafka's message.max.bytes (1 MB)
        assert producer.send_many_nowait("t", [b"a", b"b", too_big, b"c"], [b"1", b"2", b"3", b"4"]) == 2
    finally:
        producer._producer.purge(in_queue=True, in_flight=True)
        producer.close(timeout_s=0.1)
