"""A worker's readiness (``GET /ready``): started, partitions assigned, tables recovered.

A group consuming with faust is ready once its consumer has partitions and its tables are
restored; a group with its own consumer (sink, anomaly, retry, DLQ) once that consumer has
partitions; an HTTP-only group (the gateway) once started. :class:`WorkerState` is what the
views know about their worker beyond the faust App.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import faust

from app.platform.faust.recovery import table_recovery
from app.platform.http.nonces import NonceLedger

__all__ = ["AssignmentSource", "ReadyCheck", "WorkerState", "faust_consumer_of", "readiness", "uses_consumer"]

log = logging.getLogger(__name__)


#: Partitions a group's own (non-faust) consumer owns: ``(topic, partition)`` pairs.
AssignmentSource = Callable[[], Iterable[tuple[str, int]]]
#: Extra readiness check of a group: ``(ready, reason)``.
ReadyCheck = Callable[[], tuple[bool, str]]


@dataclass(slots=True)
class WorkerState:
    """What the views need to know about their worker beyond the faust App itself."""

    group: str
    #: ``None`` until the worker initialises; then whether the App runs faust's Kafka consumer.
    consumer: bool | None = None
    #: Set once the App has fully started (after table recovery; its tasks are running).
    started: bool = False
    #: Assignment of a consumer the group runs itself (sink, anomaly, retry use confluent-kafka).
    assignment: AssignmentSource | None = field(default=None, repr=False)
    #: The group's own readiness condition, checked once the App has started.
    ready_check: ReadyCheck | None = field(default=None, repr=False)
    #: The shared nonce store of a group that serves signed routes (``None``: none, or local).
    nonces: NonceLedger | None = field(default=None, repr=False)


def uses_consumer(app: faust.App) -> bool:
    """Whether ``app`` consumes with faust (it defines agents or tables)."""
    return bool(app.agents) or bool(app.tables)


def faust_consumer_of(app: faust.App) -> Any:
    """faust's consumer of an App that consumes with it (``None`` for one that does not)."""
    return app.consumer if uses_consumer(app) else None


def readiness(app: faust.App, state: WorkerState) -> tuple[bool, dict[str, Any]]:
    """``(ready, body)`` of ``GET /ready``.

    Ready = started, and: with faust's consumer, partitions assigned and tables recovered; with an
    own consumer (``state.assignment``), partitions assigned; plus ``state.ready_check`` if given.
    A group without any consumer (the HTTP-only gateway) is ready once started. The body is
    open to anyone who can reach the port: it says why not ready in fixed words, never with
    exception text (which may name hosts or carry credentials).
    """
    body: dict[str, Any] = {"group": state.group}
    if getattr(app, "crashed", False):
        return False, {**body, "status": "crashed", "reason": "the app crashed"}
    # A table restore is reported as soon as it runs: it can begin before the worker says started.
    restores = table_recovery(app)
    tables = restores.progress() if restores is not None else []
    restoring = [t for t in tables if t.recovering]
    if restoring:
        return False, {
            **body,
            "status": "recovering",
            "reason": "; ".join(t.describe() for t in restoring),
            "tables": [t.as_dict() for t in tables],
        }
    if not state.started:
        return False, {**body, "status": "starting", "reason": "worker still starting (or recovering tables)"}
    consumer = state.consumer if state.consumer is not None else uses_consumer(app)
    partitions: int | None = None
    if consumer:
        faust_consumer = faust_consumer_of(app)
        try:
            assignment = faust_consumer.assignment() if faust_consumer is not None else None
        except Exception:  # ConsumerNotStarted and friends: not ready yet
            assignment = None
        if assignment is None:
            return False, {**body, "status": "starting", "reason": "consumer not started"}
        if not assignment:
            return False, {**body, "status": "unassigned", "reason": "no partitions assigned to this worker"}
        recovery = cast(Any, app.tables).recovery
        if not recovery.completed.is_set() or getattr(app, "in_recovery", False):
            return False, {
                **body,
                "status": "recovering",
                "reason": "tables are being recovered from changelogs",
            }
        if tables:
            body["tables"] = [t.as_dict() for t in tables]
        partitions = len(assignment)
    elif state.assignment is not None:
        try:
            owned = list(state.assignment())
        except Exception as exc:  # the group's consumer is not up yet (the detail is for the log)
            log.debug("readiness of %s: consumer not started: %s", state.group, exc)
            return False, {**body, "status": "starting", "reason": "consumer not started"}
        if not owned:
            return False, {**body, "status": "unassigned", "reason": "no partitions assigned to this worker"}
        consumer, partitions = True, len(owned)
    if state.ready_check is not None:
        ok, reason = state.ready_check()
        if not ok:
            return False, {**body, "status": "not_ready", "reason": reason}
    if state.nonces is not None and not state.nonces.ready:
        return False, {**body, "status": "not_ready", "reason": "reading the nonces of the skew window"}
    ready: dict[str, Any] = {**body, "status": "ready", "consumer": bool(consumer)}
    if partitions is not None:
        ready["partitions"] = partitions
    return True, ready
