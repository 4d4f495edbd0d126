"""``avcc dlq ...``: the DLQ console's JSON API from the command line.

The DLQ store is a RocksDB owned by the running ops worker (one process at a time), so these
commands call that worker over HTTP (``/dlq.json``, ``/dlq/{id}.json`` and the POST endpoints)
with the operator login from ``AVCC_OPERATOR`` (``user:password``; ``admin:admin`` in dev mode).

Exit codes: 0 done, 1 refused or not found, 2 cannot reach / authenticate with the ops worker.

A dead letter is whatever a producer sent, so everything printed from it goes through
:func:`terminal_safe`: control characters (an ESC sequence can rewrite the operator's screen,
set the window title or worse) and bidi overrides are shown escaped; printable text in any
script stays as it is.
"""

from __future__ import annotations

import base64
import os
import sys
import unicodedata
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from app.ops.dlq.console import console_base_url
from app.platform.errors import AvccError
from app.platform.settings import get_settings

__all__ = [
    "ConsoleClient",
    "ConsoleError",
    "discard_cmd",
    "list_cmd",
    "reinject_cmd",
    "show_cmd",
    "terminal_safe",
]

#: How long ``avcc dlq reinject --topic/--error-class`` waits for the whole batch.
BULK_TIMEOUT_S = 900.0
#: ``user:password`` of the operator the CLI logs in as.
OPERATOR_ENV = "AVCC_OPERATOR"


class ConsoleError(AvccError):
    """The console answered with an error (``status`` 0: not reachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ConsoleClient:
    """Minimal synchronous client of the console's JSON API."""

    def __init__(self, base_url: str, user: str, password: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.auth = f"Basic {token}"
        self.timeout_s = timeout_s

    @classmethod
    def from_environment(cls) -> ConsoleClient:
        """Base URL from the settings, login from ``AVCC_OPERATOR`` (dev mode: admin:admin)."""
        settings = get_settings()
        raw = os.environ.get(OPERATOR_ENV)
        if not raw:
            if not settings.dev_mode:
                raise ConsoleError(0, f"set {OPERATOR_ENV}=user:password (an operator login of the console)")
            raw = "admin:admin"
        user, sep, password = raw.partition(":")
        if not sep or not user:
            raise ConsoleError(0, f"{OPERATOR_ENV} must look like user:password")
        return cls(console_base_url(settings), user, password)

    def request(
        self, method: str, path: str, body: Any | None = None, *, timeout_s: float | None = None
    ) -> Any:
        """Call ``path``; returns the decoded JSON answer or raises :class:`ConsoleError`."""
        data = orjson.dumps(body) if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as response:
                return orjson.loads(response.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = str(orjson.loads(raw).get("error", raw.decode(errors="replace")))
            except (orjson.JSONDecodeError, AttributeError):
                message = raw.decode(errors="replace").strip() or exc.reason
            raise ConsoleError(exc.code, message) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ConsoleError(0, f"cannot reach the ops worker at {self.base_url}: {exc}") from exc


#: Unicode categories shown escaped: controls, format characters (bidi overrides, zero-width),
#: surrogates, private use, unassigned, line and paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escaped(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def terminal_safe(value: object, *, multiline: bool = False) -> str:
    """``str(value)`` fit for a terminal: unsafe characters as ``\\xNN`` / ``\\uNNNN`` escapes
    (a backslash itself is kept); ``multiline`` keeps newlines and tabs (payloads, stack traces)."""
    text = str(value)
    kept = "\n\t" if multiline else ""
    return "".join(
        _escaped(ch) if ch not in kept and unicodedata.category(ch) in _UNSAFE_CATEGORIES else ch
        for ch in text
    )


def _fail(exc: ConsoleError) -> int:
    print(f"error: {terminal_safe(exc)}", file=sys.stderr)
    return 2 if exc.status in {0, 401, 403, 503} else 1


def _client() -> ConsoleClient:
    return ConsoleClient.from_environment()


def list_cmd(
    topic: str | None = None,
    group: str | None = None,
    error_class: str | None = None,
    status: str | None = None,
) -> int:
    """Print the dead letters matching the filters, one per line."""
    query = {
        k: v
        for k, v in {"topic": topic, "group": group, "error_class": error_class, "status": status}.items()
        if v
    }
    try:
        answer = _client().request("GET", "/dlq.json" + (f"?{urlencode(query)}" if query else ""))
    except ConsoleError as exc:
        return _fail(exc)
    items = answer.get("items", [])
    print(f"{'id':12} {'status':10} {'failed at (UTC)':24} {'group':12} {'topic':32} {'error':24} event id")
    for item in items:
        line = (
            f"{item['dlq_id']:12} {item['status']:10} {item['failed_at']:24} "
            f"{item['consumer_group'][:12]:12} "
            f"{item['original_topic'][:32]:32} {item['error_class'].rsplit('.', 1)[-1][:24]:24} "
            f"{item.get('event_id') or '-'}"
        )
        print(terminal_safe(line))
    counts = ", ".join(f"{k}: {v}" for k, v in answer.get("counts", {}).items())
    print(f"{len(items)} shown; totals {counts}")
    return 0


def show_cmd(dlq_id: str) -> int:
    """Print one dead letter: metadata, headers, payload, stack trace and audit trail."""
    try:
        d = _client().request("GET", f"/dlq/{quote(dlq_id, safe='')}.json")
    except ConsoleError as exc:
        return _fail(exc)
    out = terminal_safe
    print(
        out(
            f"dead letter {d['dlq_id']}  status={d['status']}  re-injections={d['reinjections']}/"
            f"{d['max_reinjections']}"
        )
    )
    for name in (
        "original_topic",
        "original_partition",
        "original_offset",
        "consumer_group",
        "error_class",
        "error_message",
        "event_id",
        "key",
        "attempt",
        "failed_at",
    ):
        print(f"  {name:20} {out(d.get(name))}")
    print("headers:")
    for h in d["headers"]:
        value = h["value"] if h["value"] is not None else "base64:" + h["value_b64"]
        print(f"  {out(h['name'])}: {out(value)}")
    print(f"payload ({out(d['payload_kind'])}):")
    print(out(d["payload"], multiline=True))
    if d.get("stacktrace"):
        print("stack trace:")
        print(out(d["stacktrace"], multiline=True))
    print("audit trail:")
    for a in d["audit"] or []:
        line = f"  {a['at']} {a['who']} {a['action']} {a.get('reason') or ''} {a.get('detail') or ''}"
        print(out(line.rstrip()))
    if not d["audit"]:
        print("  (none)")
    return 0


def reinject_cmd(
    ids: list[str], operator: str, topic: str | None = None, error_class: str | None = None
) -> int:
    """Re-inject the given ids, or (no ids) every ``new`` dead letter of ``topic`` / ``error_class``."""
    try:
        client = _client()
    except ConsoleError as exc:
        return _fail(exc)
    if not ids:
        filters = {k: v for k, v in {"topic": topic, "error_class": error_class}.items() if v}
        if not filters:
            print(
                "error: give dead-letter ids, or --topic / --error-class for a bulk re-injection",
                file=sys.stderr,
            )
            return 2
        try:
            # each re-injection is claimed and recorded in the shared state (~1 s): allow big batches
            result = client.request(
                "POST", "/dlq/bulk-reinject", {**filters, "operator": operator}, timeout_s=BULK_TIMEOUT_S
            )
        except ConsoleError as exc:
            return _fail(exc)
        for dlq_id in result["reinjected"]:
            print(f"reinjected {terminal_safe(dlq_id)}")
        for dlq_id, reason in result["refused"].items():
            print(f"refused {terminal_safe(dlq_id)}: {terminal_safe(reason)}", file=sys.stderr)
        print(f"{len(result['reinjected'])} re-injected, {len(result['refused'])} refused")
        return 1 if result["refused"] else 0
    code = 0
    for dlq_id in ids:
        try:
            entry = client.request("POST", f"/dlq/{quote(dlq_id, safe='')}/reinject", {"operator": operator})
        except ConsoleError as exc:
            code = max(code, _fail(exc))
            continue
        line = f"reinjected {entry['dlq_id']} into {entry['original_topic']} (status {entry['status']})"
        print(terminal_safe(line))
    return code


def discard_cmd(dlq_id: str, operator: str, reason: str) -> int:
    """Discard one dead letter with a reason."""
    try:
        entry = _client().request(
            "POST", f"/dlq/{quote(dlq_id, safe='')}/discard", {"operator": operator, "reason": reason}
        )
    except ConsoleError as exc:
        return _fail(exc)
    print(terminal_safe(f"discarded {entry['dlq_id']} (status {entry['status']})"))
    return 0
