"""AVCC code issuance: structure, uniqueness, stability and check-character strength."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.lifecycle.code.avcc_code import check_char, issue_code, parse_code, record_id_of, verify_check_char
from schemas.types import MA_CODE_PATTERN

HASH = "sha256:" + "ab" * 32
ids = st.integers(min_value=1, max_value=2**63 - 1)
digits = st.text(alphabet=string.digits, min_size=1, max_size=10)
hashes = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).map(lambda h: "sha256:" + h)


def test_example_code_shape() -> None:
    code = issue_code(10042, HASH, "10005", "8361")
    assert code.startswith("MA.156.10005.8361/AV")
    assert re.fullmatch(MA_CODE_PATTERN, code)
    assert verify_check_char(code)
    assert parse_code(code)[:2] == ("10005", "8361")
    assert record_id_of(code) == 10042


def test_stable_on_replay() -> None:
    assert issue_code(7, HASH, "1", "2") == issue_code(7, HASH, "1", "2")


def test_unique_over_many_ids() -> None:
    codes = {issue_code(i, HASH, "10005", "8361") for i in range(1, 20_001)}
    assert len(codes) == 20_000


@given(ids, hashes, digits, digits)
def test_pattern_and_round_trip(record_id: int, content_hash: str, org: str, node: str) -> None:
    code = issue_code(record_id, content_hash, org, node)
    assert re.fullmatch(MA_CODE_PATTERN, code)
    assert len(code) <= 160
    assert verify_check_char(code)
    assert parse_code(code) == (org, node, code.split("/", 1)[1])
    assert record_id_of(code) == record_id


@given(ids, ids)
def test_distinct_ids_give_distinct_codes(a: int, b: int) -> None:
    assert (issue_code(a, HASH, "1", "1") == issue_code(b, HASH, "1", "1")) == (a == b)


@given(ids, hashes, digits, digits, st.data())
def test_any_single_substitution_is_detected(
    record_id: int, content_hash: str, org: str, node: str, data: st.DataObject
) -> None:
    code = issue_code(record_id, content_hash, org, node)
    pos = data.draw(st.integers(min_value=0, max_value=len(code) - 1))
    new = data.draw(st.sampled_from(string.printable).filter(lambda c: c != code[pos]))
    assert not verify_check_char(code[:pos] + new + code[pos + 1 :])


def test_every_substitution_exhaustively() -> None:
    code = issue_code(123456789, HASH, "10005", "8361")
    for pos, old in enumerate(code):
        for new in string.ascii_letters + string.digits + "._-/":
            if new != old:
                assert not verify_check_char(code[:pos] + new + code[pos + 1 :]), (pos, new)


def test_check_char_alphabet() -> None:
    assert check_char("") in string.digits + string.ascii_uppercase


@pytest.mark.parametrize(
    ("record_id", "org", "node"), [(0, "1", "1"), (2**63, "1", "1"), (1, "", "1"), (1, "1", "12345678901")]
)
def test_bad_inputs_refused(record_id: int, org: str, node: str) -> None:
    with pytest.raises(ValueError):
        issue_code(record_id, HASH, org, node)


@pytest.mark.parametrize("code", ["", "MA.156.1.2", "XA.156.1.2/AB", "MA.156.1.2/a b"])
def test_parse_refuses_non_codes(code: str) -> None:
    with pytest.raises(ValueError):
        parse_code(code)
    assert not verify_check_char(code)


def test_parse_accepts_foreign_bodies() -> None:
    assert parse_code("MA.156.10005.8361/x_y-z.1") == ("10005", "8361", "x_y-z.1")
    with pytest.raises(ValueError):
        record_id_of("MA.156.10005.8361/x_y-z.1")
