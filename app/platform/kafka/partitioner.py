"""Java-compatible murmur2 partitioning, so every language's producer picks the same partition."""

from __future__ import annotations

__all__ = ["murmur2", "partition_for", "record_key"]

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as a signed 32-bit int (same results as the Java client)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    full = length - (length & 3)
    for i in range(0, full, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """Partition of ``key`` exactly as the Java default partitioner picks it."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def record_key(avcc_record_id: int) -> bytes:
    """Message key of a core-topic event: the record id as a UTF-8 decimal string."""
    return str(avcc_record_id).encode()
