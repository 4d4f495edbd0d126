"""Hand-written contract check of ``topic.playback.event`` for the sink's hot path.

:func:`parse_playback` (one document) and :func:`playback_columns` (a whole chunk, column by
column with C-level ``map``/``set``/``bytes`` operations instead of per-event Python code) accept
exactly what ``app.platform.contracts.decode_event`` accepts for ``topic.playback.event``
(proved by ``tests/unit/playback/test_sink_checks.py``) at a fraction of pydantic's cost. A
chunk :func:`playback_columns` cannot prove valid as a whole is left to the per-event
:func:`parse_playback`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from itertools import repeat
from operator import itemgetter
from typing import Any, Final

from app.playback.sink.store import EVENT_TYPES
from schemas.envelope import Envelope
from schemas.playback import MAX_DURATION_SEC, PlaybackEvent
from schemas.types import (
    EXACT_FLOAT_INT,
    MA_CODE_PATTERN,
    MAX_EPOCH_MS,
    MIN_EPOCH_MS,
    PLATFORM_NODE_PATTERN,
    SHA256_PATTERN,
    SOURCE_PATTERN,
)

__all__ = [
    "ParsedPlayback",
    "money_cents",
    "parse_playback",
    "payload_columns",
    "playback_columns",
    "playback_row",
]


def _full(pattern: str) -> Callable[[str], re.Match[str] | None]:
    # pydantic's patterns are ``^...$`` with Rust semantics ($ = end of text): fullmatch agrees.
    return re.compile(pattern.removeprefix("^").removesuffix("$")).fullmatch


_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").fullmatch
_SOURCE: Final = _full(SOURCE_PATTERN)
_MA_CODE: Final = _full(MA_CODE_PATTERN)
_NODE: Final = _full(PLATFORM_NODE_PATTERN)
_SHA256: Final = _full(SHA256_PATTERN)
_TOKEN: Final = re.compile(r"[!-~]{1,128}").fullmatch
_MONEY_TEXT: Final = re.compile(r"-?[0-9]{1,12}(?:\.[0-9]{1,2})?").fullmatch
_EVENT_TYPES: Final = frozenset(EVENT_TYPES)
_MA_CODE_MAX: Final = 160
_MONEY_LIMIT: Final = 10**12
_FLOAT_LIMIT: Final = 1e12

#: ``(event_id, ts_ms, source, avcc_code, platform_node, user_hash, event_type, duration_sec,
#: revenue_cents, idempotency_id)``: :data:`PLAYBACK_INSERT_COLUMNS` without the Kafka position.
ParsedPlayback = tuple[str, int, str, str, str, str, str, int, int, str]

#: Strings already known to satisfy a field's pattern (codes, nodes, users and sources repeat a
#: lot; a set lookup costs a tenth of the regex). Bounded: cleared when full.
_KNOWN_LIMIT: Final = 1 << 16
_known_sources: set[str] = set()
_known_codes: set[str] = set()
_known_nodes: set[str] = set()
_known_users: set[str] = set()
#: Money text -> cents (prices repeat a lot). Bounded like the sets.
_cents_of_text: dict[str, int] = {}


def _remember(known: set[str], value: str) -> None:
    if len(known) >= _KNOWN_LIMIT:
        known.clear()
    known.add(value)


def _text_cents(text: str) -> int | None:
    """Cents of a ``NonNegativeMoney`` string (``-?d{1,12}(.d{1,2})?``, only a negative zero)."""
    if _MONEY_TEXT(text) is None:
        return None
    whole, _, fraction = text.removeprefix("-").partition(".")
    cents = int(whole) * 100 + (int(fraction) * (10 if len(fraction) == 1 else 1) if fraction else 0)
    if text[0] == "-" and cents:
        return None
    return cents


def money_cents(value: object) -> int | None:
    """Exact cents of a JSON money value, or ``None`` where ``NonNegativeMoney`` refuses it.

    Strings ``"12.5"``, integers and whole floats (``12.0``), below 10**12, not negative (a
    negative zero is 0).
    """
    kind = type(value)
    if kind is str:
        text: str = value  # type: ignore[assignment]
        cents = _cents_of_text.get(text)
        if cents is None:
            cents = _text_cents(text)
            if cents is None:
                return None
            if len(_cents_of_text) >= _KNOWN_LIMIT:
                _cents_of_text.clear()
            _cents_of_text[text] = cents
        return cents
    if kind is int:
        number: int = value  # type: ignore[assignment]
        return number * 100 if 0 <= number < _MONEY_LIMIT else None
    if kind is float:
        real: float = value  # type: ignore[assignment]
        if not math.isfinite(real) or not real.is_integer() or not 0 <= real < _FLOAT_LIMIT:
            return None
        return int(real) * 100
    return None


def _whole(value: object) -> int | None:
    """A JSON integer, or a JSON number with a zero fraction up to 2**53 as one (``WholeInt``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) <= EXACT_FLOAT_INT:
        return int(value)
    return None


def parse_playback(obj: object) -> ParsedPlayback | None:
    """The row of a playback envelope (already JSON-decoded), or ``None`` if it breaks the contract.

    Equivalent to ``Envelope[PlaybackEvent]`` in strict mode on orjson output: exact keys, exact
    JSON types (no bool-as-int; a float only with a zero fraction, as the models read it),
    patterns, enums, ranges, money strings with at most two decimals or whole money numbers. A
    value of the wrong JSON type makes a set lookup or a regex raise ``TypeError``, which is a
    refusal too.
    """
    if type(obj) is not dict or len(obj) != 4:
        return None
    try:
        event_id = obj["event_id"]
        ts_ms = obj["timestamp"]
        source = obj["source"]
        payload = obj["payload"]
        if _UUID(event_id) is None:
            return None
        if type(ts_ms) is not int:
            ts_ms = _whole(ts_ms)
        if ts_ms is None or not MIN_EPOCH_MS <= ts_ms < MAX_EPOCH_MS:
            return None
        if source not in _known_sources:
            if _SOURCE(source) is None:
                return None
            _remember(_known_sources, source)
        if type(payload) is not dict:
            return None
        size = len(payload)
        avcc_code = payload["avcc_code"]
        node = payload["platform_node"]
        user_hash = payload["user_hash"]
        event_type = payload["event_type"]
        duration = payload["duration_sec"]
        revenue = payload["revenue_cny"]
        if size == 6:
            idempotency_id = ""
        elif size == 7 and "idempotency_id" in payload:
            token = payload["idempotency_id"]
            if token is None:
                idempotency_id = ""
            elif _TOKEN(token) is not None:
                idempotency_id = token
            else:
                return None
        else:
            return None
        if avcc_code not in _known_codes:
            if _MA_CODE(avcc_code) is None or len(avcc_code) > _MA_CODE_MAX:
                return None
            _remember(_known_codes, avcc_code)
        if node not in _known_nodes:
            if _NODE(node) is None:
                return None
            _remember(_known_nodes, node)
        if user_hash not in _known_users:
            if _SHA256(user_hash) is None:
                return None
            _remember(_known_users, user_hash)
        if event_type not in _EVENT_TYPES:
            return None
    except (KeyError, TypeError):
        return None
    if type(duration) is not int:
        duration = _whole(duration)
    if duration is None or not 0 <= duration <= MAX_DURATION_SEC:
        return None
    revenue_cents = _cents_of_text.get(revenue) if type(revenue) is str else None
    if revenue_cents is None:
        revenue_cents = money_cents(revenue)
        if revenue_cents is None:
            return None
    return (
        event_id,
        ts_ms,
        source,
        avcc_code,
        node,
        user_hash,
        event_type,
        duration,
        revenue_cents,
        idempotency_id,
    )


def playback_row(envelope: Envelope[PlaybackEvent]) -> ParsedPlayback:
    """The row of an already validated event (what :func:`parse_playback` returns for its JSON)."""
    p = envelope.payload
    return (
        str(envelope.event_id),
        envelope.timestamp,
        envelope.source,
        p.avcc_code,
        p.platform_node,
        p.user_hash,
        p.event_type,
        p.duration_sec,
        int(p.revenue_cny * 100),
        p.idempotency_id or "",
    )


# --- chunk-wise (columnar) validation --------------------------------------------------------

_HEX_DIGITS: Final = b"0123456789abcdef"
#: Fixed-width formats checked column-wise: ``x`` is one of ``[0-9a-f]``, anything else itself.
_UUID_TEMPLATE: Final = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
#: ``SHA256_PATTERN`` as a template; ``None`` (per-value regex) if the schema's pattern changed.
_SHA256_TEMPLATE: Final = "sha256:" + "x" * 64 if SHA256_PATTERN == r"^sha256:[0-9a-f]{64}$" else None

_ENVELOPE_FIELDS: Final = (itemgetter("event_id"), itemgetter("timestamp"), itemgetter("source"))
_PAYLOAD_OF: Final = itemgetter("payload")
_PAYLOAD_FIELDS: Final = tuple(
    itemgetter(name)
    for name in ("avcc_code", "platform_node", "user_hash", "event_type", "duration_sec", "revenue_cny")
)
_MISSING: Final = object()
#: Number of :data:`ParsedPlayback` fields.
_ROW_WIDTH: Final = 10


def _all_fixed(values: list[Any], template: str) -> bool:
    """Whether every value is a ``str`` of ``template``'s shape (see :data:`_UUID_TEMPLATE`).

    Same verdict as a per-value ``fullmatch`` of the equivalent regex, in C-level string ops:
    join, check the literal positions by slicing, delete the hex digits, count what is left.
    """
    count = len(values)
    width = len(template)
    try:
        joined = "".join(values)
    except TypeError:  # a value that is not a string
        return False
    if len(joined) != width * count or set(map(len, values)) != {width}:
        return False
    try:
        raw = joined.encode("ascii")
    except UnicodeEncodeError:
        return False
    literal_left = 0
    for position, char in enumerate(template):
        if char == "x":
            continue
        if raw[position::width] != char.encode("ascii") * count:
            return False
        if char.encode("ascii") not in _HEX_DIGITS:
            literal_left += 1
    # Only the literal non-hex characters may survive deleting the hex digits.
    return len(raw.translate(None, _HEX_DIGITS)) == literal_left * count


def _all_known_or_valid(values: list[Any], known: set[str], check: Callable[[str], object]) -> bool:
    """Whether every value is a ``str`` in ``known`` or passing ``check`` (which then joins ``known``)."""
    try:
        distinct = set(values)
    except TypeError:  # unhashable: a list or an object
        return False
    if distinct <= known:
        return True
    fresh = distinct - known
    for value in fresh:
        if type(value) is not str or not check(value):
            return False
    if len(known) + len(fresh) > _KNOWN_LIMIT:
        known.clear()
    if len(fresh) <= _KNOWN_LIMIT:
        known |= fresh
    return True


def _valid_code(value: str) -> bool:
    return len(value) <= _MA_CODE_MAX and _MA_CODE(value) is not None


def _valid_user(value: str) -> bool:
    return _SHA256(value) is not None


def _whole_column_within(values: list[Any], low: int, high: int) -> list[int] | None:
    """``values`` as integers when every one is an ``int`` (not a ``bool``) or a whole float
    (:func:`_whole`) with ``low <= value <= high``; else ``None``."""
    kinds = set(map(type, values))
    if kinds != {int}:
        if not kinds <= {int, float}:
            return None
        wholes = list(map(_whole, values))
        if None in wholes:
            return None
        values = wholes
    return values if min(values) >= low and max(values) <= high else None


def _idempotency_column(payloads: list[dict[str, Any]], count: int) -> list[str] | None:
    sizes = set(map(len, payloads))
    if sizes == {6}:
        return [""] * count
    if not sizes <= {6, 7}:
        return None
    tokens = list(map(dict.get, payloads, repeat("idempotency_id"), repeat(_MISSING)))
    # Every payload of 7 keys must have its seventh be the idempotency id.
    if count - tokens.count(_MISSING) != sum(map(len, payloads)) - 6 * count:
        return None
    column: list[str] = []
    for token in tokens:
        if token is _MISSING or token is None:
            column.append("")
        elif type(token) is str and _TOKEN(token) is not None:
            column.append(token)
        else:
            return None
    return column


def payload_columns(payloads: list[Any]) -> list[list[Any]] | None:
    """The payload columns of ``payloads`` (``PlaybackEvent`` documents), or ``None`` unless *all*
    are valid: ``[codes, nodes, users, event types, durations, revenue cents, idempotency ids]``.

    The strict check (exact JSON types, money as a string) of :func:`parse_playback`'s payload
    half, column by column; the gateway validates partner batches with it and the sink whole
    chunks of envelopes. ``None`` sends the caller to its per-document check.
    """
    count = len(payloads)
    if not count:
        return [[] for _ in range(_ROW_WIDTH - 3)]
    # orjson decodes to dict, list, str, int, float, bool or None: a string-keyed lookup that
    # succeeds proves a dict (the others raise TypeError), so no separate type pass is needed.
    try:
        codes, nodes, users, kinds, durations, revenues = (
            list(map(get, payloads)) for get in _PAYLOAD_FIELDS
        )
        if not set(kinds) <= _EVENT_TYPES:
            return None
        distinct_revenues = set(revenues)
    except (KeyError, TypeError):  # a missing field; not a dict; an unhashable value
        return None
    whole_durations = _whole_column_within(durations, 0, MAX_DURATION_SEC)
    if not (
        whole_durations is not None
        and _all_known_or_valid(codes, _known_codes, _valid_code)
        and _all_known_or_valid(nodes, _known_nodes, _NODE)
        and (
            _all_fixed(users, _SHA256_TEMPLATE)
            if _SHA256_TEMPLATE is not None
            else _all_known_or_valid(users, _known_users, _valid_user)
        )
    ):
        return None
    cents_of: dict[str, int] = {}
    for revenue in distinct_revenues:
        if type(revenue) is not str:  # numbers: the per-document check decides
            return None
        cents = money_cents(revenue)
        if cents is None:
            return None
        cents_of[revenue] = cents
    idempotency_ids = _idempotency_column(payloads, count)
    if idempotency_ids is None:
        return None
    revenue_cents = list(map(cents_of.__getitem__, revenues))
    return [codes, nodes, users, kinds, whole_durations, revenue_cents, idempotency_ids]


def playback_columns(documents: list[Any]) -> list[list[Any]] | None:
    """The :data:`ParsedPlayback` columns of decoded envelopes, or ``None`` unless *all* are valid.

    Accepts a chunk exactly when :func:`parse_playback` accepts every document of it, with the
    same values (column ``i`` holds field ``i`` of each row); otherwise returns ``None`` and the
    caller checks the documents one by one. Costs a fraction of the per-document check: the
    per-value work is C-level ``map``, ``set`` and ``bytes`` operations.
    """
    if not documents:
        return [[] for _ in range(_ROW_WIDTH)]
    try:
        if set(map(len, documents)) != {4}:
            return None
        event_ids, timestamps, sources = (list(map(get, documents)) for get in _ENVELOPE_FIELDS)
        payloads = list(map(_PAYLOAD_OF, documents))
    except (KeyError, TypeError):  # a missing field; not a dict
        return None
    whole_timestamps = _whole_column_within(timestamps, MIN_EPOCH_MS, MAX_EPOCH_MS - 1)
    if not (
        _all_fixed(event_ids, _UUID_TEMPLATE)
        and whole_timestamps is not None
        and _all_known_or_valid(sources, _known_sources, _SOURCE)
    ):
        return None
    payload = payload_columns(payloads)
    if payload is None:
        return None
    return [event_ids, whole_timestamps, sources, *payload]
