"""Schemathesis driver of the API fuzz test: every operation of a worker's ``/openapi.json``.

:func:`fuzz_worker` loads the document a running worker serves, generates cases for each of its
operations with hypothesis (what the document allows, or what it forbids), sends them signed
(:class:`HmacAuth`, a key holding every scope) or unsigned, and checks every answer with
schemathesis: no 5xx, a documented status, the documented content type and body schema.
Failures are collected per operation (not stopped at the first) and a :class:`FuzzSummary`
counts calls and statuses.

Reproducible: the cases come from a fixed seed (``AVCC_FUZZ_SEED``, default :data:`SEED`) and
their number is the budget (``max_examples`` per operation); the time a run took is reported,
never a reason to stop. ``make fuzz`` is the longer, exploratory run (not part of ``make test``):
a new seed each run, printed with every summary line, so a failure it finds is replayed with
``AVCC_FUZZ_SEED=<seed>``.
"""

from __future__ import annotations

import os
import random
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.platform.http.auth import sign_request

__all__ = ["CHECKS", "SEED", "FuzzSummary", "HmacAuth", "call_documented", "fuzz_seed", "fuzz_worker"]

#: The seed of ``make test``'s fuzz runs: the same cases every run. (Known finding, open in the
#: product: ``AVCC_FUZZ_SEED=20261127`` makes the negative runs send the sink's
#: ``GET /v1/playback/stats`` a query string over the 8190-byte request line aiohttp's parser
#: allows; the HTTP server answers ``400 text/plain`` ("Got more than 8190 bytes when
#: reading"), which no route documents: ST105 undocumented Content-Type.)
SEED = 1


def fuzz_seed() -> int:
    """``AVCC_FUZZ_SEED`` if set; a fresh random seed with ``AVCC_FUZZ_EXPLORE=1``; else :data:`SEED`."""
    if os.environ.get("AVCC_FUZZ_SEED"):
        return int(os.environ["AVCC_FUZZ_SEED"])
    if os.environ.get("AVCC_FUZZ_EXPLORE", "") in {"1", "true", "yes"}:
        return random.SystemRandom().randrange(2**32)
    return SEED


#: What every answer must satisfy.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


class HmacAuth(requests.auth.AuthBase):
    """Signs the final request (method, path+query and body bytes as sent) with ``sign_request``."""

    def __init__(self, key: str, secret: str) -> None:
        self.key = key
        self.secret = secret

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        parts = urlsplit(request.url or "")
        path_qs = parts.path + (f"?{parts.query}" if parts.query else "")
        body = request.body or b""
        raw = body.encode() if isinstance(body, str) else bytes(body)
        request.headers.update(sign_request(request.method or "GET", path_qs, raw, self.key, self.secret))
        return request


@dataclass
class FuzzSummary:
    """What one fuzz run of one worker did."""

    worker: str
    mode: str
    seed: int = SEED
    operations: list[str] = field(default_factory=list)
    calls: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    #: Operations without any input to break (negative mode).
    not_negatable: list[str] = field(default_factory=list)
    #: ``/v1/`` calls answered 2xx (signed runs must have some, unsigned ones none).
    v1_accepted: int = 0
    seconds: float = 0.0

    @property
    def server_errors(self) -> int:
        """Answers with a 5xx status other than the documented 503 (retry later)."""
        return sum(n for status, n in self.statuses.items() if status >= 500 and status != 503)

    def line(self) -> str:
        """One line for the CI log."""
        seen = " ".join(f"{status}x{n}" for status, n in sorted(self.statuses.items()))
        return (
            f"api fuzz {self.worker:<10} {self.mode:<8} operations={len(self.operations)} calls={self.calls} "
            f"v1_2xx={self.v1_accepted} 5xx_not_503={self.server_errors} failures={len(self.failures)} "
            f"statuses=[{seen}] {self.seconds:.1f}s seed={self.seed}"
        )


def fuzz_worker(
    worker: str,
    base_url: str,
    auth: HmacAuth | None,
    *,
    max_examples: int,
    seed: int = SEED,
    mode: GenerationMode = GenerationMode.POSITIVE,
) -> FuzzSummary:
    """Fuzz every operation of the worker at ``base_url`` (see the module docstring) with
    ``max_examples`` cases each, drawn from ``seed``, that fit the document (``POSITIVE``) or
    break it (``NEGATIVE``)."""
    started = time.monotonic()
    summary = FuzzSummary(worker, f"{'signed' if auth is not None else 'unsigned'}/{mode.value[:3]}", seed)
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    session = requests.Session()
    operations = [result.ok() for result in schema.get_all_operations()]
    summary.operations = [operation.label for operation in operations]
    for operation in operations:

        @hypothesis.seed(seed)
        @hypothesis.settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
        )
        @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
        def exercise(case: Any) -> None:
            response = case.call(base_url=base_url, session=session, auth=auth, timeout=30)
            summary.calls += 1
            summary.statuses[response.status_code] += 1
            if response.status_code < 300 and case.operation.path.startswith("/v1/"):
                summary.v1_accepted += 1
            case.validate_response(response, checks=CHECKS)

        try:
            exercise()
        except hypothesis.errors.Unsatisfiable:
            if mode is GenerationMode.POSITIVE:
                raise
            summary.not_negatable.append(operation.label)  # no parameter and no body to break
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup is a BaseExceptionGroup
            detail = "".join(traceback.format_exception_only(exc)).strip()
            summary.failures.append(f"{operation.label}: {detail[:4000]}")
    session.close()
    summary.seconds = time.monotonic() - started
    return summary


def call_documented(base_url: str, method: str, path: str, auth: HmacAuth | None, **case: Any) -> Any:
    """Send one hand-made case of the worker's operation ``method path`` (``path_parameters``,
    ``query``, ``body``) and check its answer like the fuzzer does; the schemathesis response."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    operation = schema[path][method]
    made = operation.Case(**case)
    return made.call_and_validate(base_url=base_url, auth=auth, timeout=30, checks=CHECKS)
