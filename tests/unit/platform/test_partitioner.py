"""murmur2 partitioning must equal the Java client's (Kafka's published test vectors)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.platform.kafka.partitioner import murmur2, partition_for, record_key

#: org.apache.kafka.common.utils.UtilsTest#testMurmur2 (and values from Utils.murmur2 itself).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"10042": 304051539,
    b"": 275646681,
    "héllo".encode(): 614509002,
}


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS.items(), ids=lambda v: repr(v)[:20])
def test_murmur2_matches_the_java_client(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_record_key_is_the_utf8_decimal_string() -> None:
    assert record_key(10042) == b"10042"


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=256))
def test_partition_is_in_range_and_stable(key: bytes, partitions: int) -> None:
    p = partition_for(key, partitions)
    assert 0 <= p < partitions
    assert p == partition_for(key, partitions)
