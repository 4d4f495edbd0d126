"""Two-stage anomaly detection without a broker: partials, completeness, duplicates, replica count."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable
from typing import Any

from app.playback.anomaly.merge import ClosedWindow, Merger, MergeState
from app.playback.anomaly.partials import bucket_of, decode_partial, encode_partials, split_window
from app.playback.anomaly.rules import WindowAgg
from app.playback.anomaly.settings import AnomalyRuleSettings
from app.playback.anomaly.windows import PartitionState, Windows
from tests.unit.playback.test_anomaly_windows import NOW, T0, W, envelope

CFG = AnomalyRuleSettings(window_s=W // 1000, spike_min_count=100, replay_min_count=30, share_min_count=100)
SOURCES = 24
BUCKETS = 12


def code(i: int) -> str:
    return f"MA.156.10005.8361/AV2026{i:06d}"


def traffic(seed: int = 5) -> list[tuple[int, int, dict[str, Any]]]:
    """Seeded (partition, offset, envelope) events: uniform windows 0-5, a burst and a replay in
    window 5 spread over every partition, then ticks in window 8 that close windows 0-6."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []

    def anyone() -> str:
        return f"sha256:{rng.randrange(500):064x}"

    for w in range(6):
        events += [
            envelope(T0 + w * W + i * 20, code=code(rng.randrange(20)), user=anyone()) for i in range(2400)
        ]
    events += [envelope(T0 + 5 * W + i * 30, code=code(3), user=anyone()) for i in range(1500)]
    replayer = "sha256:" + "ef" * 32
    events += [envelope(T0 + 5 * W + i * 900, code=code(7), user=replayer) for i in range(48)]
    events += [envelope(T0 + 8 * W + i, code=code(i % 20), user=anyone()) for i in range(SOURCES * 2)]
    offsets = [0] * SOURCES
    placed = []
    for i, event in enumerate(events):
        partition = i % SOURCES if i >= len(events) - SOURCES * 2 else rng.randrange(SOURCES)
        placed.append((partition, offsets[partition], event))
        offsets[partition] += 1
    return placed


def stage_one(owned: Iterable[int], events: list[tuple[int, int, dict[str, Any]]]) -> list[tuple[int, bytes]]:
    """One worker's stage 1 over its partitions: the (bucket, record) partials it sends."""
    windows = Windows(CFG, lateness_windows=1, max_future_ms=600_000)
    windows.adopt({p: PartitionState(p) for p in owned})
    records: list[tuple[int, bytes]] = []
    for chunk in range(0, len(events), 500):  # consume batches; close after each, as the loop does
        windows.count(events[chunk : chunk + 500], NOW)
        for close in windows.close(windows.watermark()):
            records += list(enumerate(encode_partials(close, BUCKETS)))
    for partition in list(windows.states):
        windows.reached_end(partition)
    for close in windows.close(windows.watermark()):
        records += list(enumerate(encode_partials(close, BUCKETS)))
    return records


def stage_two(records: list[tuple[int, bytes]], owned: Iterable[int] = range(BUCKETS)) -> list[ClosedWindow]:
    merger = Merger(CFG, sources=SOURCES)
    merger.adopt({b: MergeState(b) for b in owned})
    closed: list[ClosedWindow] = []
    for offset, (bucket, record) in enumerate(records):
        merger.add(bucket, offset, decode_partial(record))
        closed += merger.close()
    return closed


def findings(closed: list[ClosedWindow]) -> set[tuple[str, str, int, float]]:
    return {(f.rule, f.key, w.start, f.observed) for w in closed for f in w.findings}


def test_split_window_puts_each_code_in_its_bucket_and_keeps_the_total() -> None:
    agg = WindowAgg()
    for i in range(40):
        agg.add(CFG, code(i % 9), "8300", f"u{i % 3}", "purchase", 5, "99999", str(uuid.uuid4()))
    parts = split_window(agg, 4)
    for bucket, part in enumerate(parts):
        assert part.events == 40
        assert all(bucket_of(c, 4) == bucket for c in part.codes)
        assert all(bucket_of(c, 4) == bucket for c, _ in [*part.nodes, *part.pairs])
        assert all(bucket_of(c, 4) == bucket for _, c in part.points)
    assert sum(sum(p.codes.values()) for p in parts) == 40
    assert sum(len(p.pairs) for p in parts) == len(agg.pairs)
    assert sum(len(p.points) for p in parts) == len(agg.points) == 9


def test_partials_record_round_trip_keeps_single_pairs() -> None:
    windows = Windows(CFG, lateness_windows=0, max_future_ms=600_000)
    windows.adopt({3: PartitionState(3)})
    windows.count([(3, i, envelope(T0 + i, user=f"sha256:{i:064x}")) for i in range(5)], NOW)
    windows.count([(3, 5, envelope(T0 + W))], NOW)
    (close,) = windows.close(windows.watermark())
    records = encode_partials(close, BUCKETS)
    assert len(records) == BUCKETS  # every bucket hears of the progress
    decoded = [decode_partial(r) for r in records]
    assert {(p.source, p.since, p.until) for p in decoded} == {(3, 0, T0 + W)}
    full = decoded[bucket_of(code(1), BUCKETS)]  # envelope() uses one code
    assert sum(full.windows[T0].pairs.values()) == 5 and len(full.windows[T0].pairs) == 5
    assert all(p.windows[T0].events == 5 for p in decoded)


def test_a_window_is_evaluated_once_every_source_partition_closed_it_and_duplicates_merge_once() -> None:
    sources = 3
    merger = Merger(AnomalyRuleSettings(window_s=W // 1000, replay_min_count=6), sources=sources)
    merger.adopt({0: MergeState(0)})
    replayer = "sha256:" + "cd" * 32
    records = []
    for source in range(sources):
        windows = Windows(merger.rules, lateness_windows=0, max_future_ms=600_000)
        windows.adopt({source: PartitionState(source)})
        windows.count([(source, i, envelope(T0 + i, user=replayer)) for i in range(2)], NOW)
        windows.count([(source, 2, envelope(T0 + W))], NOW)
        (close,) = windows.close(windows.watermark())
        records.append(encode_partials(close, 1)[0])
    assert merger.add(0, 0, decode_partial(records[0]))
    assert merger.add(0, 1, decode_partial(records[1]))
    assert not merger.add(0, 2, decode_partial(records[1]))  # a replay of source 1's record
    assert merger.close() == []  # source 2 has not closed the window yet
    assert merger.add(0, 3, decode_partial(records[2]))
    (window,) = merger.close()
    assert (window.start, window.events, window.partitions) == (T0, 6, [0, 1, 2])
    assert [(f.rule, f.observed) for f in window.findings] == [("user_replay", 6.0)]
    assert merger.close() == [] and merger.states[0].offset == 4


def test_merge_state_snapshot_round_trip() -> None:
    state = MergeState(5, offset=9, marks={0: T0, 1: T0 + W})
    agg = state.windows[T0] = WindowAgg()
    agg.add(CFG, code(1), "8300", "u", "play", 5, "0.00", "e")
    agg.add(CFG, code(1), "8300", "u", "play", 5, "0.00", "e")
    state.sources[T0] = [1]
    state.baseline.codes[code(1)] = [12.5, 3.0]
    back = MergeState.from_bytes(state.to_bytes(max_pairs=100))
    assert (back.partition, back.offset, back.marks, back.sources) == (5, 9, state.marks, {T0: [1]})
    assert back.windows[T0].codes == {code(1): 2} and back.windows[T0].pairs == {(code(1), "u"): 2}
    assert back.baseline.codes == {code(1): [12.5, 3.0]}


def test_findings_do_not_depend_on_the_number_of_workers() -> None:
    events = traffic()
    one = stage_two(stage_one(range(SOURCES), events))
    shares = [range(0, 8), range(8, 16), range(16, 24)]
    # three workers: their partials interleave in the partials partitions in any order
    per_worker = [stage_one(share, [e for e in events if e[0] in share]) for share in shares]
    interleaved = [r for batch in zip(*per_worker, strict=False) for r in batch]
    interleaved += [r for records in per_worker for r in records[min(map(len, per_worker)) :]]
    three = stage_two(interleaved)
    found = findings(one)
    assert found == findings(three)
    assert {rule for rule, *_ in found} == {"traffic_spike", "user_replay"}
    assert {start for *_, start, _ in found} == {T0 + 5 * W}
    # every bucket evaluates windows 0-5 once (window 6 had no events; 7 and 8 are still open)
    assert sorted(w.start for w in one) == sorted(w.start for w in three)
    assert sorted(w.start for w in one) == sorted(T0 + w * W for w in range(6) for _ in range(BUCKETS))
