"""AVCC code issuance: deterministic ``MA.156.<org>.<node>/<body>`` codes with a check character."""

from __future__ import annotations

import hashlib
import re
from typing import Final

__all__ = [
    "CROCKFORD_ALPHABET",
    "check_char",
    "issue_code",
    "parse_code",
    "record_id_of",
    "verify_check_char",
]

#: Crockford base32 (no I, L, O, U), upper case.
CROCKFORD_ALPHABET: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: Alphabet of ISO 7064 MOD 37,36 (digits then upper-case letters).
_ISO_ALPHABET: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ID_CHARS: Final = 13  # 13 * 5 bits >= 63 bits: any RecordId fits
_HASH_CHARS: Final = 8  # 40 bits of sha256(content_hash)
_MAX_ID: Final = 2**63 - 1
_C32: Final = "[0-9A-HJKMNP-TV-Z]"
_CODE: Final = re.compile(
    rf"MA\.156\.([0-9]{{1,10}})\.([0-9]{{1,10}})/(AV({_C32}{{{_ID_CHARS}}})\.({_C32}{{{_HASH_CHARS}}})([0-9A-Z]))"
)
_GENERIC: Final = re.compile(r"MA\.156\.([0-9]{1,10})\.([0-9]{1,10})/([A-Za-z0-9._-]{1,128})")
_DIGITS: Final = re.compile(r"[0-9]{1,10}")


def _crockford(value: int, width: int) -> str:
    chars = []
    for _ in range(width):
        value, digit = divmod(value, 32)
        chars.append(CROCKFORD_ALPHABET[digit])
    if value:
        raise ValueError(f"value does not fit in {width} base32 characters")
    return "".join(reversed(chars))


def check_char(data: str) -> str:
    """ISO 7064 MOD 37,36 check character of ``data`` (characters of ``[0-9A-Z]`` only)."""
    p = 36
    for char in data:
        s = (p + _ISO_ALPHABET.index(char)) % 36 or 36
        p = (2 * s) % 37
    return _ISO_ALPHABET[(37 - p) % 36]


def _protected(org: str, node: str, body_without_check: str) -> str:
    """The characters the check character covers: org, node and the body's alphanumerics."""
    return org + node + body_without_check.replace(".", "")


def issue_code(avcc_record_id: int, content_hash: str, org: str, node: str) -> str:
    """The AVCC code of a record: ``MA.156.{org}.{node}/AV{id:13}.{hash:8}{check}``.

    The id part is the zero-padded Crockford base32 record id (unique per record); the hash part
    is the first 40 bits of ``sha256(content_hash)``; the check character (ISO 7064 MOD 37,36)
    covers org, node and body, so any single-character substitution is detected.
    """
    if not 1 <= avcc_record_id <= _MAX_ID:
        raise ValueError("avcc_record_id must be in 1 .. 2**63-1")
    if _DIGITS.fullmatch(org) is None or _DIGITS.fullmatch(node) is None:
        raise ValueError("org and node must be 1-10 digits")
    digest = hashlib.sha256(content_hash.encode("utf-8")).digest()
    hash_part = _crockford(int.from_bytes(digest[:5], "big"), _HASH_CHARS)
    body = f"AV{_crockford(avcc_record_id, _ID_CHARS)}.{hash_part}"
    return f"MA.156.{org}.{node}/{body}{check_char(_protected(org, node, body))}"


def verify_check_char(code: str) -> bool:
    """True if ``code`` has the issued structure and a correct check character."""
    match = _CODE.fullmatch(code)
    if match is None:
        return False
    org, node, body = match.group(1), match.group(2), match.group(3)
    return check_char(_protected(org, node, body[:-1])) == body[-1]


def parse_code(code: str) -> tuple[str, str, str]:
    """``(org, node, body)`` of any code matching ``MA_CODE_PATTERN``; ``ValueError`` otherwise."""
    match = _GENERIC.fullmatch(code)
    if match is None:
        raise ValueError(f"not an MA code: {code!r}")
    return match.group(1), match.group(2), match.group(3)


def record_id_of(code: str) -> int:
    """The record id encoded in an issued code (check character verified); ``ValueError`` otherwise."""
    match = _CODE.fullmatch(code)
    if match is None or not verify_check_char(code):
        raise ValueError(f"not a valid issued AVCC code: {code!r}")
    value = 0
    for char in match.group(4):
        value = value * 32 + CROCKFORD_ALPHABET.index(char)
    return value
