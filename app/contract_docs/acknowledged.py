"""Narrowings of the published contracts made on purpose, each with why it breaks no event.

The compatibility gate (:mod:`app.contract_docs.compat`) compares schemas, not the
pipeline's behaviour: when a published schema said less than the models always enforced, stating
the rule is a "narrowing" to the gate although no event the pipeline accepted becomes invalid.
Such changes, and the deliberate breaks partners were told about, are listed here as the gate
reports them; ``avcc contracts check`` prints them as acknowledged instead of failing. An entry
matches a break by its change and detail exactly and by its field as an ``fnmatch`` pattern, so
no other change of the same field is waved through. Entries can go once the ref the gate compares
with (``make contracts``: the merge base with main) publishes the new schemas.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Final

from app.contract_docs.compat import Break
from schemas.types import WHITESPACE_CLASS

__all__ = ["ACKNOWLEDGED", "Acknowledged", "acknowledgement"]

#: What ``schemas/json`` published for "not blank" and content URLs before issue 26: ``\\s`` and
#: ``\\S``, which Python's ``re``, ECMA-262 and the models' Rust engine read differently.
_OLD_NOT_BLANK: Final = r"\S"
_OLD_CONTENT_URL: Final = (
    r"^(?:(?:s3|oss|https?)://[^\s/?#@\x00-\x1f\x7f]+/[^\s\x00-\x1f\x7f]+"
    r"|ipfs://[^\s/?#@\x00-\x1f\x7f]+(?:/[^\s\x00-\x1f\x7f]*)?)$"
)
_W: Final = WHITESPACE_CLASS
_NEW_CONTENT_URL: Final = (
    rf"^(?:(?:s3|oss|https?)://[^{_W}/?#@\x00-\x1f\x7f]+/[^{_W}\x00-\x1f\x7f]+"
    rf"|ipfs://[^{_W}/?#@\x00-\x1f\x7f]+(?:/[^{_W}\x00-\x1f\x7f]*)?)$(?!\n)"
)
_WHITESPACE_REASON: Final = (
    "the models always read \\s as Unicode White_Space (Rust regex); the schema now names those 25 "
    "characters, so Python's re and ECMA-262 (which differ on U+001C-U+001F, U+0085, U+FEFF) agree"
)


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """A reported break that is made on purpose, and why."""

    field: str
    change: str
    detail: str
    reason: str

    def covers(self, item: Break) -> bool:
        """Whether ``item`` is this change."""
        same = item.change == self.change and item.detail == self.detail
        return same and fnmatchcase(item.field, self.field)


ACKNOWLEDGED: Final = (
    Acknowledged(
        "payload.*_cny",
        "type narrowed",
        "number no longer accepted",
        "issue 26: a money JSON number must be whole (cents as decimal strings, '12.50'): whether a "
        "binary float was written with 2 decimals is beyond every JSON Schema validator "
        "(multipleOf 0.01 refuses 0.07), so the old number branch let partners send amounts the "
        "pipeline refused; every event the pipeline writes carries money as a string",
    ),
    Acknowledged(
        "payload.*",
        "constraint narrowed",
        f"pattern {_OLD_NOT_BLANK!r} -> {f'[^{_W}]'!r}",
        _WHITESPACE_REASON,
    ),
    Acknowledged(
        "payload.content_url",
        "constraint narrowed",
        f"pattern {_OLD_CONTENT_URL!r} -> {_NEW_CONTENT_URL!r}",
        _WHITESPACE_REASON,
    ),
)


def acknowledgement(item: Break) -> Acknowledged | None:
    """The entry of :data:`ACKNOWLEDGED` covering ``item``, if any."""
    return next((entry for entry in ACKNOWLEDGED if entry.covers(item)), None)
