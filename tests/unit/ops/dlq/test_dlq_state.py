"""Shared DLQ state: versioned changes, their application in log order, and replicas converging."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.ops.dlq.entries import AuditEntry, DiscardRefused, DlqError, ReinjectRefused
from app.ops.dlq.state import (
    CLAIM_TTL_MS,
    Claim,
    EntryState,
    EventState,
    StateChange,
    apply_change,
    claim_active,
    state_partition,
)
from app.ops.dlq.store import DlqStore
from tests.unit.ops.dlq.dead_letters import T0, FakeSender, dead_letter


def _change(change_id: str, base: int, status: str = "discarded", who: str = "bob") -> StateChange:
    audit = (AuditEntry(T0 + base, who, status, "why", None),)
    return StateChange(change_id, "review|ev-1", base, "0-1", EntryState(status, 0, audit), 0)  # type: ignore[arg-type]


class RecordingJournal:
    """A journal that records every change as the state topic would, applying it locally."""

    def __init__(self, store: DlqStore) -> None:
        self.store = store
        self.log: list[StateChange] = []

    async def sync(self, event_key: str) -> None:
        pass

    async def commit(self, change: StateChange) -> bool:
        self.log.append(change)
        return self.store.apply(change, (0, len(self.log) - 1))


def test_a_change_applies_only_to_the_version_it_was_computed_from() -> None:
    first = _change("a", 0)
    after = apply_change(EventState(), first)
    assert after == EventState(1, 0, None)
    assert apply_change(after, _change("b", 0)) is None  # stale: a concurrent change came first
    assert apply_change(after, _change("c", 1)) == EventState(2, 0, None)


def test_change_round_trips_through_its_wire_form() -> None:
    claim = Claim("tok", "0-1", "alice", T0)
    change = StateChange("id-1", "review|ev-1", 4, "0-1", EntryState("reinjected", 2, ()), 3, claim)
    back = StateChange.from_json(change.to_json())
    assert back == change and back.event == EventState(5, 3, claim)


def test_claims_expire() -> None:
    claim = Claim("tok", "0-1", "alice", T0)
    assert claim_active(claim, T0 + CLAIM_TTL_MS - 1)
    assert not claim_active(claim, T0 + CLAIM_TTL_MS)
    assert not claim_active(None, T0)


def test_state_partition_is_stable_and_in_range() -> None:
    keys = [f"review|ev-{n}" for n in range(200)]
    parts = [state_partition(k, 3) for k in keys]
    assert parts == [state_partition(k, 3) for k in keys]
    assert set(parts) == {0, 1, 2}


async def test_replicas_folding_one_log_agree_and_a_rebuilt_store_shows_the_same(tmp_path: Path) -> None:
    sender = FakeSender()
    with DlqStore(tmp_path / "a", sender=sender) as a:
        journal = RecordingJournal(a)
        a.journal = journal
        for offset, event in ((1, "ev-1"), (2, "ev-2"), (3, "ev-3")):
            dead_letter(a, offset, event_id=event)
        await a.reinject("0-1", "alice", reason="fixed")
        await a.discard("0-2", "bob", "junk")
        # a second replica acted on the version before the discard: refused in log order
        stale = a.get("0-2")
        racing = StateChange(
            "late", stale.event_key(), 0, "0-2", EntryState("discarded", 0, (AuditEntry(T0, "eve", "x"),)), 0
        )
        assert not a.apply(racing, (0, len(journal.log)))
        journal.log.append(racing)
        view_a = [(e.dlq_id, e.status, e.audit) for e in a.list()]
        counts_a = a.counts()

    # a replica (or a rebuilt disk) reads the state log before the dead letters themselves
    with DlqStore(tmp_path / "b") as b:
        for offset, change in enumerate(journal.log):
            b.apply(change, (0, offset))
        for offset, event in ((1, "ev-1"), (2, "ev-2"), (3, "ev-3")):
            dead_letter(b, offset, event_id=event)
        assert [(e.dlq_id, e.status, e.audit) for e in b.list()] == view_a
        assert b.counts() == counts_a == {"new": 1, "reinjected": 1, "discarded": 1}
        assert b.state_offsets() == {0: len(journal.log)}
        assert b.reinjections_of(b.get("0-1")) == 1
        assert [a.who for a in b.get("0-2").audit] == ["bob"]


async def test_an_active_claim_of_another_replica_blocks_actions_until_it_expires(
    store: DlqStore, sender: FakeSender
) -> None:
    dlq_id = dead_letter(store, 1, event_id="ev-1")
    entry = store.get(dlq_id)
    claim = Claim("tok", dlq_id, "carol", 10**15)  # taken "in the future": still active
    assert store.apply(StateChange("c1", entry.event_key(), 0, dlq_id, EntryState(), 0, claim))
    with pytest.raises(ReinjectRefused, match="being re-injected by carol"):
        await store.reinject(dlq_id, "alice")
    with pytest.raises(DiscardRefused, match="being re-injected"):
        await store.discard(dlq_id, "alice", "junk")
    assert sender.sent == []
    expired = Claim("tok", dlq_id, "carol", T0)
    assert store.apply(StateChange("c2", entry.event_key(), 1, dlq_id, EntryState(), 0, expired))
    await store.reinject(dlq_id, "alice")
    assert len(sender.sent) == 1 and store.event_state(entry.event_key()).claim is None


async def test_a_refused_commit_is_reported_and_changes_nothing(store: DlqStore) -> None:
    class Refusing(RecordingJournal):
        async def commit(self, change: StateChange) -> bool:
            return False

    dlq_id = dead_letter(store, 1)
    store.journal = Refusing(store)
    with pytest.raises(DlqError, match="changed at the same time"):
        await store.discard(dlq_id, "bob", "junk")
    assert store.get(dlq_id).status == "new" and store.counts()["new"] == 1
