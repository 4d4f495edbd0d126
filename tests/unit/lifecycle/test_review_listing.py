"""The review task listing: filters, oldest first, keyset pages merged over replicas."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.lifecycle.review.listing import TaskPage, TaskQuery, merge_pages


def task(record_id: int, created_ms: int, **fields: Any) -> dict[str, Any]:
    return {"avcc_record_id": record_id, "created_ms": created_ms, "status": "need_human", **fields}


def test_query_parses_filters_and_refuses_bad_ones() -> None:
    query = TaskQuery.parse(
        {
            "status": "need_human",
            "applicant_id": "a-1",
            "final_level": "P",
            "created_before_ms": "99",
            "after": "5:7",
        }
    )
    assert query == TaskQuery("need_human", "a-1", "P", 99, (5, 7), None)
    assert TaskQuery.parse({"limit": "50", "after": ""}) == TaskQuery(limit=50)
    for bad, name in [
        ({"final_level": "X"}, "final_level"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"after": "5"}, "after"),
        ({"created_before_ms": "-1"}, "created_before_ms"),
        ({"applicant_id": "a" * 129}, "applicant_id"),
    ]:
        with pytest.raises(ValueError, match=f"^{name}: "):
            TaskQuery.parse(bad)


def test_filters_by_applicant_level_and_age() -> None:
    tasks = [
        task(1, 100, applicant_id="a", final_level="P"),
        task(2, 200, applicant_id="b", final_level="P"),
        task(3, 300, applicant_id="a", final_level="G"),
        task(4, 50, applicant_id="a", final_level="P", status="done"),
    ]
    ids = lambda q: [t["avcc_record_id"] for t in q.page(tasks).tasks]  # noqa: E731
    assert ids(TaskQuery(status="need_human", applicant_id="a")) == [1, 3]
    assert ids(TaskQuery(status="need_human", final_level="P")) == [1, 2]
    assert ids(TaskQuery(status="need_human", created_before_ms=300)) == [1, 2]
    assert ids(TaskQuery()) == [4, 1, 2, 3]  # oldest first


def test_pages_merged_over_replicas_walk_every_task_once_oldest_first() -> None:
    """Three replicas hold disjoint tasks (many created in the same millisecond); walking the
    merged pages with the next cursor gives every matching task once, in order."""
    rng = random.Random(26)
    replicas: list[list[dict[str, Any]]] = [[], [], []]
    for record_id in range(1, 301):
        applicant = "pages" if record_id % 4 == 0 else "other"
        replicas[record_id % 3].append(task(record_id, 1000 + rng.randint(0, 20), applicant_id=applicant))
    everything = sorted(
        (t for r in replicas for t in r), key=lambda t: (t["created_ms"], t["avcc_record_id"])
    )
    wanted = [t["avcc_record_id"] for t in everything if t["applicant_id"] == "pages"]
    seen: list[int] = []
    after: str | None = None
    starts = []
    while True:
        params = {"applicant_id": "pages", "limit": "20", **({"after": after} if after else {})}
        query = TaskQuery.parse(params)
        body = merge_pages(query, [query.page(r) for r in replicas]).as_json()
        assert body["total"] == len(wanted)
        starts.append(body["total"] - body["remaining"] + 1)
        seen.extend(t["avcc_record_id"] for t in body["tasks"])
        after = body["next"]
        if after is None:
            break
    assert seen == wanted and starts == [1, 21, 41, 61]


def test_a_page_from_an_older_peer_still_merges() -> None:
    page = TaskPage.from_json({"tasks": [task(9, 5)], "count": 1})
    assert (page.total, page.remaining) == (1, 1)
    merged = merge_pages(TaskQuery(), [page, page])  # a task listed twice counts once
    assert [t["avcc_record_id"] for t in merged.tasks] == [9] and merged.total == 1
    assert merged.as_json()["next"] is None
