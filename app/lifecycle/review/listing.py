"""The review task listing: filters, oldest-first order and pages over every replica's tasks.

``GET /v1/review/tasks`` takes ``status``, ``applicant_id``, ``final_level``,
``created_before_ms`` (tasks waiting since before then: an age), ``after`` (the ``next`` cursor
of the previous page) and ``limit``. Each replica pages its own tasks with the query
(:meth:`TaskQuery.page`), and the replica the client asked merges the pages
(:func:`merge_pages`): tasks are ordered by ``(created_ms, avcc_record_id)``, a total order,
so the first ``limit`` tasks after the cursor over all replicas are among the first ``limit`` of
each. The merged page says how many tasks match in all (``total``) and how many from this page on
(``remaining``), which is where a page starts: ``total - remaining + 1``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, get_args

from schemas.types import MAX_EPOCH_MS, FinalLevel

__all__ = ["CURSOR_PATTERN", "MAX_LIMIT", "TaskPage", "TaskQuery", "merge_pages"]

#: ``created_ms:avcc_record_id`` of the last task of a page.
CURSOR_PATTERN: Final = r"^[0-9]{1,16}:[0-9]{1,19}$"
#: Most tasks one page holds.
MAX_LIMIT: Final = 1000
_CURSOR: Final = re.compile(CURSOR_PATTERN.removeprefix("^").removesuffix("$"))
_LEVELS: Final = frozenset(get_args(FinalLevel))
_TEXT_LIMIT: Final = 128

#: A task as the API shows it (:meth:`ReviewTask.public`).
Task = Mapping[str, Any]


def _order(task: Task) -> tuple[int, int]:
    return int(task["created_ms"]), int(task["avcc_record_id"])


def _text(query: Mapping[str, str], name: str) -> str | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    if len(value) > _TEXT_LIMIT:
        raise ValueError(f"{name}: at most {_TEXT_LIMIT} characters")
    return value


def _integer(query: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 19) or not low <= int(value) <= high:
        raise ValueError(f"{name}: must be an integer from {low} to {high}")
    return int(value)


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """Which tasks, from where, how many."""

    status: str | None = None
    applicant_id: str | None = None
    final_level: str | None = None
    created_before_ms: int | None = None
    after: tuple[int, int] | None = None
    limit: int | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> TaskQuery:
        """The query of a query string (``ValueError`` names the bad parameter)."""
        level = _text(query, "final_level")
        if level is not None and level not in _LEVELS:
            raise ValueError(f"final_level: one of {', '.join(sorted(_LEVELS))}")
        cursor = _text(query, "after")
        after = None
        if cursor is not None:
            if _CURSOR.fullmatch(cursor) is None:
                raise ValueError("after: the next cursor of a page (created_ms:avcc_record_id)")
            created, record = cursor.split(":")
            after = (int(created), int(record))
        return cls(
            status=_text(query, "status"),
            applicant_id=_text(query, "applicant_id"),
            final_level=level,
            created_before_ms=_integer(query, "created_before_ms", 0, MAX_EPOCH_MS),
            after=after,
            limit=_integer(query, "limit", 1, MAX_LIMIT),
        )

    def matches(self, task: Task) -> bool:
        """Whether ``task`` passes the filters (the cursor aside)."""
        return (
            (self.status is None or task.get("status") == self.status)
            and (self.applicant_id is None or task.get("applicant_id") == self.applicant_id)
            and (self.final_level is None or task.get("final_level") == self.final_level)
            and (self.created_before_ms is None or int(task["created_ms"]) < self.created_before_ms)
        )

    def page(self, tasks: Iterable[Task]) -> TaskPage:
        """The page of ``tasks`` (one replica's, or everyone's) this query asks for."""
        matching = [task for task in tasks if self.matches(task)]
        after = self.after
        rest = sorted((t for t in matching if after is None or _order(t) > after), key=_order)
        shown = rest if self.limit is None else rest[: self.limit]
        return TaskPage(list(shown), len(matching), len(rest))


@dataclass(frozen=True, slots=True)
class TaskPage:
    """A page of tasks, how many match in all, and how many from this page's first on."""

    tasks: list[Task]
    total: int
    remaining: int

    def as_json(self) -> dict[str, Any]:
        """The route's body; ``next`` is the cursor of the following page (``None``: last page)."""
        more = self.remaining > len(self.tasks)
        last = self.tasks[-1] if self.tasks else None
        cursor = f"{last['created_ms']}:{last['avcc_record_id']}" if more and last is not None else None
        return {
            "tasks": self.tasks,
            "count": len(self.tasks),
            "total": self.total,
            "remaining": self.remaining,
            "next": cursor,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> TaskPage:
        """A page a peer answered (older peers send only ``tasks`` and ``count``)."""
        tasks = list(body["tasks"])
        return cls(tasks, int(body.get("total", len(tasks))), int(body.get("remaining", len(tasks))))


def merge_pages(query: TaskQuery, pages: Iterable[TaskPage]) -> TaskPage:
    """One page over the replicas' pages of ``query`` (a task two replicas list, as during a
    rebalance, counts once)."""
    unique: dict[int, Task] = {}
    total = remaining = 0
    for page in pages:
        total += page.total
        remaining += page.remaining
        for task in page.tasks:
            record_id = int(task["avcc_record_id"])
            if record_id in unique:
                total, remaining = total - 1, remaining - 1
            else:
                unique[record_id] = task
    ordered = sorted(unique.values(), key=_order)
    shown = ordered if query.limit is None else ordered[: query.limit]
    return TaskPage(shown, total, remaining)
