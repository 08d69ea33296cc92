"""Listing and tidying a journal (DESIGN 22): ``tasks(limit=, states=)`` filters and cuts in
SQL, newest first, fast at any size; ``count()`` counts the same rows; ``prune()`` removes
final rows whose last change is old, never a row that still needs something."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from imggw_client import ImageRequest, RequestValidationError, Submission
from imggw_client._core.states import Accepted, NotFound, Saved, Sending
from imggw_client.tracking import Journal, Scope

SCOPE = Scope("http://127.0.0.1:9", "f" * 16)
OTHER = Scope("http://127.0.0.1:9", "e" * 16)
DAY = 86400.0


def _task(journal: Journal, n: int, scope: Scope = SCOPE) -> str:
    """A journaled task, id ``n``, pending."""
    key = f"key-{n:06d}-{scope.key_fingerprint[:4]}"
    journal.record(Sending(key, "beta", ImageRequest(f"p{n}")), scope)
    journal.record(Accepted(Submission(task_id=str(n), idempotency_key=key, surface="beta")), scope)
    return str(n)


def _age(path: Path, task_id: str, days: float) -> None:
    """Moves a row's last change ``days`` into the past."""
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE tasks SET changed = changed - ?, created = created - ? WHERE task_id = ?",
            (days * DAY, days * DAY, task_id),
        )


def test_tasks_filters_and_cuts_newest_first_and_count_agrees(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    ids = [_task(journal, n) for n in range(1, 8)]
    _task(journal, 99, OTHER)
    journal.record(Saved("2", "beta", ("a.png",)), SCOPE)  # not succeeded yet: ignored
    journal.record(NotFound("3", "beta"), SCOPE)
    assert [e.task_id for e in journal.tasks(limit=3)] == ["99", "7", "6"]
    assert [e.task_id for e in journal.tasks(limit=3, scope=SCOPE)] == ["7", "6", "5"]
    assert journal.tasks(limit=0) == []
    found = journal.tasks(states=["not_found"])
    assert [(e.task_id, e.state, e.status) for e in found] == [("3", "not_found", "not_found")]
    assert [e.task_id for e in journal.tasks(states={"pending", "not_found"}, limit=2)] == [
        "99",
        "7",
    ]
    assert journal.count() == 8
    assert journal.count(scope=SCOPE) == len(ids)
    assert journal.count(unfinished=True, scope=SCOPE) == 6  # not_found is final
    assert journal.count(states=["not_found"]) == 1
    assert journal.count(states=[]) == 0
    for bad in ({"states": ["done"]}, {"states": "pending"}, {"limit": -1}, {"limit": True}):
        with pytest.raises(RequestValidationError) as refused:
            journal.tasks(**bad)  # type: ignore[arg-type]
        assert refused.value.code == "invalid_option"
    journal.close()


def test_prune_removes_old_final_rows_only(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = Journal(path)
    for n in range(1, 7):
        _task(journal, n)
    _task(journal, 50, OTHER)
    journal.record(NotFound("1", "beta"), SCOPE)  # final, old
    journal.record(NotFound("2", "beta"), SCOPE)  # final, recent
    journal.record(NotFound("50", "beta"), OTHER)  # final, old, another key's
    for task_id in ("1", "3", "50"):  # 3: old but pending: never pruned
        _age(path, task_id, 40)
    assert journal.prune(scope=SCOPE) == 1
    assert sorted(e.task_id for e in journal.tasks()) == ["2", "3", "4", "5", "50", "6"]  # type: ignore[type-var]
    assert journal.prune(older_than=0) == 2  # everything final, whoever's
    assert sorted(e.task_id for e in journal.tasks()) == ["3", "4", "5", "6"]  # type: ignore[type-var]
    with pytest.raises(RequestValidationError):
        journal.prune(older_than=float("nan"))
    journal.close()


@pytest.mark.slow  # about 1 s to write the rows
def test_the_newest_fifty_of_a_hundred_thousand_come_at_once(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    Journal(path).close()  # the schema
    now = time.time()
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO tasks (gateway, key_fp, surface, idempotency_key, task_id, state, "
            "prompt, aspect_ratio, resolution, created, files) "
            "VALUES (?, ?, 'beta', ?, ?, 'saved', 'a fox', 'auto', '1k', ?, '[]')",
            (
                (SCOPE.gateway, SCOPE.key_fingerprint, f"k{n}", str(n), now - 100_000 + n)
                for n in range(1, 100_001)
            ),
        )
    journal = Journal(path)
    with sqlite3.connect(path) as db:  # read from the end of the table: no sort, no full read
        plan = " ".join(
            r[-1]
            for r in db.execute("EXPLAIN QUERY PLAN SELECT * FROM tasks ORDER BY row DESC LIMIT 50")
        )
    assert "TEMP B-TREE" not in plan
    for scope in (None, SCOPE):
        took = []
        for _ in range(3):
            start = time.perf_counter()
            newest = journal.tasks(limit=50, scope=scope)
            took.append(time.perf_counter() - start)
        assert [e.task_id for e in newest[:2]] == ["100000", "99999"]
        assert len(newest) == 50
        assert min(took) < 0.1  # about 1 ms (the scope through an index: 48 ms)
    assert journal.count() == 100_000
    journal.close()
