"""log_matches: a log read unfiltered is matched on the emitting contract and its first topics,
whatever form (checksum or lower-case address, bytes or hex topics) the node answered in."""

from __future__ import annotations

from hexbytes import HexBytes

from app.lifecycle.chain.evm import event_topic
from app.lifecycle.chain.evm_logs import log_matches
from app.lifecycle.chain.registry import WORK_EVENT

CONTRACT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
WORK = event_topic(WORK_EVENT)
RECORD_7 = "0x" + (7).to_bytes(32, "big").hex()


def _log(address: str, *topics: str) -> dict[str, object]:
    return {"address": address, "topics": [HexBytes(t) for t in topics]}


def test_the_registration_of_the_record_matches() -> None:
    assert log_matches(_log(CONTRACT, WORK, RECORD_7), CONTRACT, [WORK, RECORD_7])
    assert log_matches(_log(CONTRACT.lower(), WORK, RECORD_7), CONTRACT, [WORK])
    assert log_matches({"address": CONTRACT, "topics": [WORK.upper().replace("0X", "0x")]}, CONTRACT, [WORK])


def test_another_contract_record_or_event_does_not() -> None:
    other = "0x" + "11" * 20
    record_8 = "0x" + (8).to_bytes(32, "big").hex()
    assert not log_matches(_log(other, WORK, RECORD_7), CONTRACT, [WORK, RECORD_7])
    assert not log_matches(_log(CONTRACT, WORK, record_8), CONTRACT, [WORK, RECORD_7])
    assert not log_matches(_log(CONTRACT, record_8, RECORD_7), CONTRACT, [WORK, RECORD_7])
    assert not log_matches(_log(CONTRACT, WORK), CONTRACT, [WORK, RECORD_7])
