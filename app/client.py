"""Partner client of the ``/v1/`` HTTP API: signed requests, playback in batches, applications.

Standard library only (``urllib``) plus this package's signing, so a partner can vendor it::

    from app.client import AvccClient

    client = AvccClient("http://127.0.0.1:6067", key="partner-a", secret="...",
                        playback_url="http://127.0.0.1:6071")
    receipt = client.apply({"request_id": "req-1", ...})       # 202 body: avcc_record_id, status
    report = client.send_playback(events, batch_size=500)       # PlaybackReport(accepted, rejected)
    batch = client.apply_batch([line, ...])                     # BatchReport: one answer per line

Every request carries fresh ``X-AVCC-*`` headers (a retry is signed again: nonces are single
use). ``429`` and ``503`` are retried after ``Retry-After`` (seconds or an HTTP date; 1 s when
absent), at most ``max_retries`` times. A ``429`` that reports which playback items were
accepted (the gateway's queue filled half-way) resends only the throttled items, so nothing is
produced twice; a bulk application batch resends only its ``throttled`` items the same way (a
resent item keeps its ``request_id``, so it can never make a second record). Other errors
raise :class:`ApiError` with the status and the JSON body.
"""

from __future__ import annotations

import email.utils
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from pydantic import BaseModel

from app.api import APPLY, APPLY_BATCH, PLAYBACK_EVENTS, RECORD, RECORD_COUNTS
from app.platform.errors import AvccError
from app.platform.http.signing import sign_request

__all__ = [
    "APPLICATIONS_PATH",
    "PLAYBACK_PATH",
    "QUEUE_FULL",
    "ApiError",
    "AvccClient",
    "BatchReport",
    "DuplicateContent",
    "PlaybackReport",
    "retry_after_s",
]

APPLICATIONS_PATH: Final = APPLY.path
PLAYBACK_PATH: Final = PLAYBACK_EVENTS.path
RECORD_PATH: Final = RECORD.path
BATCH_PATH: Final = APPLY_BATCH.path
NDJSON: Final = "application/x-ndjson"
#: The gateway's per-item error of an item it did not produce because its queue was full.
QUEUE_FULL: Final = "producer queue full, retry later"
_RETRIED: Final = frozenset({429, 503})


class ApiError(AvccError):
    """A non-2xx answer that is not retried (or still retriable after ``max_retries``)."""

    def __init__(self, status: int, body: Any, method: str, url: str) -> None:
        reason = body.get("error") if isinstance(body, dict) else body
        super().__init__(f"{method} {url}: HTTP {status}: {reason}")
        self.status = status
        self.body = body


class DuplicateContent(ApiError):
    """``409``: the work (its ``content_hash``) already has a record; ``body`` is that record."""


@dataclass(slots=True)
class PlaybackReport:
    """Outcome of :meth:`AvccClient.send_playback`, indexed by position in the input."""

    accepted: int = 0
    #: ``(index, reason)`` of every item the gateway refused (it names the field).
    rejected: list[tuple[int, str]] = field(default_factory=list)
    #: HTTP requests made, retries included.
    requests: int = 0
    #: Seconds spent waiting for ``Retry-After``.
    waited_s: float = 0.0


@dataclass(slots=True)
class BatchReport:
    """Outcome of :meth:`AvccClient.apply_batch`: the server's final answer for every item."""

    #: Per-item answers (``http_status`` 202, 400 or 409), indexed like the input.
    answers: list[dict[str, Any]] = field(default_factory=list)
    #: HTTP requests made, retries included.
    requests: int = 0
    #: 429 answers (the whole batch busy, or some items throttled) that were waited out.
    throttled: int = 0
    #: Seconds spent waiting for ``Retry-After``.
    waited_s: float = 0.0


def retry_after_s(value: str | None, now: float | None = None, default: float = 1.0) -> float:
    """Seconds to wait from a ``Retry-After`` header (delta seconds or HTTP date)."""
    if not value:
        return default
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return default
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: Any
    retry_after: str | None


def _jsonable(item: Mapping[str, Any] | BaseModel) -> Any:
    if isinstance(item, BaseModel):
        return item.model_dump(mode="json", exclude_none=True)
    return dict(item)


class AvccClient:
    """Signed calls to the code (``base_url``) and gateway (``playback_url``) workers."""

    def __init__(
        self,
        base_url: str,
        key: str,
        secret: str,
        *,
        playback_url: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 10,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.playback_url = (playback_url or base_url).rstrip("/")
        self.key = key
        self.secret = secret
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._sleep = sleep

    # --- API -----------------------------------------------------------------------------------

    def apply(self, application: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
        """Apply for an AVCC code; the 202 body. Same ``request_id`` again: the same record.

        Raises :class:`DuplicateContent` (409, with the existing record) or :class:`ApiError`.
        """
        url = self.base_url + APPLICATIONS_PATH
        answer, _ = self._call("POST", url, _jsonable(application))
        if answer.status == 409:
            raise DuplicateContent(answer.status, answer.body, "POST", url)
        return self._ok("POST", url, answer)

    def record(self, avcc_record_id: int) -> dict[str, Any]:
        """A record with its history (``GET /v1/avcc/records/{id}``)."""
        url = self.base_url + RECORD_PATH.format(avcc_record_id=avcc_record_id)
        answer, _ = self._call("GET", url, None)
        return self._ok("GET", url, answer)

    def record_counts(self) -> dict[str, int]:
        """Records by status over every record partition (summed over the code replicas that
        answered: ``GET /v1/avcc/record-counts``)."""
        url = self.base_url + RECORD_COUNTS.path
        answer, _ = self._call("GET", url, None)
        counts = self._ok("GET", url, answer).get("counts", {})
        return {str(k): int(v) for k, v in counts.items()}

    def send_playback(
        self, events: Iterable[Mapping[str, Any] | BaseModel], batch_size: int = 500
    ) -> PlaybackReport:
        """Post ``events`` in batches of ``batch_size``; per-item refusals are reported, not raised."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        report = PlaybackReport()
        batch: list[tuple[int, Any]] = []
        for index, event in enumerate(events):
            batch.append((index, _jsonable(event)))
            if len(batch) == batch_size:
                self._send_batch(batch, report)
                batch = []
        if batch:
            self._send_batch(batch, report)
        report.rejected.sort()
        return report

    def apply_batch(self, items: Sequence[bytes]) -> BatchReport:
        """Apply for every NDJSON line of ``items`` (one JSON object each) in one batch.

        Throttled items (429) are resent after ``Retry-After`` until each has its final answer;
        more than ``max_retries`` 429s in a row raise :class:`ApiError`.
        """
        url = self.base_url + BATCH_PATH
        answers: dict[int, dict[str, Any]] = {}
        pending = list(range(len(items)))
        report = BatchReport()
        retries = 0
        while pending:
            answer = self._request(
                "POST", url, None, raw=b"\n".join(items[i] for i in pending), content_type=NDJSON
            )
            report.requests += 1
            body = answer.body if isinstance(answer.body, dict) else {}
            if answer.status not in _RETRIED and answer.status != 202:
                raise ApiError(answer.status, answer.body, "POST", url)
            throttled: list[int] = []
            answered = len(answers)
            for item in body.get("items", []) if answer.status in {202, 429} else []:
                original = pending[int(item["index"])]
                if item.get("http_status") == 429:
                    throttled.append(original)
                else:
                    answers[original] = {**item, "index": original}
            if answer.status == 202:
                break
            retries = 0 if len(answers) > answered else retries + 1
            if retries > self.max_retries:
                raise ApiError(answer.status, answer.body, "POST", url)
            pending = throttled if "items" in body else pending
            report.throttled += 1
            report.waited_s += self._wait(answer)
        report.answers = [answers[i] for i in range(len(items))]
        return report

    # --- internals -----------------------------------------------------------------------------

    def _send_batch(self, batch: Sequence[tuple[int, Any]], report: PlaybackReport) -> None:
        url = self.playback_url + PLAYBACK_PATH
        pending = list(batch)
        for attempt in range(self.max_retries + 1):
            answer = self._request("POST", url, [item for _, item in pending])
            report.requests += 1
            body = answer.body if isinstance(answer.body, dict) else {}
            if answer.status not in _RETRIED and answer.status != 202:
                raise ApiError(answer.status, answer.body, "POST", url)
            throttled: list[tuple[int, Any]] = []
            if "accepted" in body:
                report.accepted += int(body["accepted"])
                for error in body.get("errors", []):
                    original = pending[int(error["index"])]
                    if answer.status != 202 and error.get("error") == QUEUE_FULL:
                        throttled.append(original)
                    else:
                        report.rejected.append((original[0], str(error.get("error"))))
            elif answer.status != 202:
                throttled = pending
            if not throttled:
                return
            if attempt == self.max_retries:
                break
            pending = throttled
            report.waited_s += self._wait(answer)
        raise ApiError(answer.status, answer.body, "POST", url)

    def _call(self, method: str, url: str, payload: Any) -> tuple[_Answer, int]:
        for attempt in range(self.max_retries + 1):
            answer = self._request(method, url, payload)
            if answer.status not in _RETRIED or attempt == self.max_retries:
                return answer, attempt + 1
            self._wait(answer)
        raise AssertionError("unreachable")

    def _wait(self, answer: _Answer) -> float:
        delay = retry_after_s(answer.retry_after)
        self._sleep(delay)
        return delay

    def _ok(self, method: str, url: str, answer: _Answer) -> dict[str, Any]:
        if not 200 <= answer.status < 300 or not isinstance(answer.body, dict):
            raise ApiError(answer.status, answer.body, method, url)
        return answer.body

    def _request(
        self,
        method: str,
        url: str,
        payload: Any,
        *,
        raw: bytes | None = None,
        content_type: str = "application/json",
    ) -> _Answer:
        if raw is None and payload is not None:
            raw = json.dumps(payload, separators=(",", ":")).encode()
        body = raw or b""
        parts = urlsplit(url)
        path_qs = parts.path + (f"?{parts.query}" if parts.query else "")
        headers = sign_request(method, path_qs, body, self.key, self.secret)
        if raw is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=raw, method=method)
        for name, value in headers.items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return _Answer(response.status, _decode(response.read()), response.headers.get("Retry-After"))
        except urllib.error.HTTPError as exc:
            with exc:
                return _Answer(exc.code, _decode(exc.read()), exc.headers.get("Retry-After"))


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")
