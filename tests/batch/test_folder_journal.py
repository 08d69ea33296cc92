"""A batch output folder's store is a journal's file (``_journal/schema.py``, DESIGN 24): one
table keeps every paid task, whoever made it. ``Journal(folder)`` lists the run's tasks (its bad
input lines are no tasks) with what a journal's listing shows, and writes nothing: the run does.
A folder left by the release before the one table is brought forward once, and listed.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from imggw_client import ConfigurationError, PollPolicy, RetryPolicy
from imggw_client._journal.schema import FORMAT, LEDGER_NAME
from imggw_client.batch import BatchReport, run_batch
from imggw_client.mock import MockGateway
from imggw_client.tracking import Journal

from .ledgers import FORMAT_5_LEDGER

FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05),
}
pytestmark = pytest.mark.gateway(duration_min=0.02, duration_max=0.05)


def batch(gw: MockGateway, lines: list[str], out: Path, **kw: Any) -> BatchReport:
    source = out.parent / "in.jsonl"
    source.write_text("".join(f"{line}\n" for line in lines))
    return run_batch(
        source, out, client_factory=lambda: gw.async_client(**FAST), skip_bad_lines=True, **kw
    )


def test_a_batch_folder_lists_its_runs_tasks_as_a_journal_does(
    gateway: MockGateway, tmp_path: Path
) -> None:
    with gateway.client(**FAST) as client:
        elsewhere = client.submit("made elsewhere")  # collected by its id
    out = tmp_path / "out"
    lines = [
        json.dumps({"prompt": "a fox", "resolution": "2k", "aspect_ratio": "16:9"}),
        "{not json",
        json.dumps({"prompt": "an owl"}),
        json.dumps({"task_id": elsewhere.task_id}),
    ]
    report = batch(gateway, lines, out)
    assert report.counts == {"saved": 3}

    journal = Journal(out)
    entries = journal.tasks()
    assert journal.path == out / LEDGER_NAME
    assert journal.count() == len(entries) == 3  # the bad line made no task
    by_prompt = {e.request.prompt: e for e in entries}
    assert set(by_prompt) == {"a fox", "an owl", ""}  # a line of a task id asks nothing
    fox = by_prompt["a fox"]
    assert (fox.request.resolution, fox.request.aspect_ratio) == ("2k", "16:9")
    assert fox.state == "saved"
    assert fox.status == "succeeded"
    assert fox.idempotency_key
    assert fox.task_id
    assert fox.charge is not None
    assert fox.charge > 0
    assert fox.created_at is not None
    assert fox.submitted_at is not None
    assert len(fox.files) == 1
    assert Path(fox.files[0]).parent == out
    assert Path(fox.files[0]).is_file()
    collected = by_prompt[""]
    assert (collected.task_id, collected.idempotency_key) == (elsewhere.task_id, "")
    assert journal.tasks(unfinished=True) == []
    assert [e.task_id for e in journal.tasks(states=["saved"], limit=1)] == [entries[0].task_id]
    assert journal.damaged() == []
    journal.close()


def test_a_batch_folder_opened_as_a_journal_writes_nothing_and_sends_nothing(
    gateway: MockGateway, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    batch(gateway, [json.dumps({"prompt": "a fox"})], out)
    before = gateway.stats()["requests"]
    journal = Journal(out)
    with pytest.raises(ConfigurationError) as refused:
        journal.prune(older_than=0)
    assert refused.value.code == "journal_unusable"
    assert "batch folder's ledger" in refused.value.message
    with (
        gateway.client(journal=journal, **FAST) as client,
        pytest.raises(ConfigurationError, match="can be listed, not written"),
    ):
        client.submit("not from here")
    assert gateway.stats()["requests"] == before  # refused before anything was sent
    assert [e.request.prompt for e in journal.tasks()] == ["a fox"]
    journal.close()


def test_a_folder_with_no_ledger_is_no_journal(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Journal(tmp_path)
    assert refused.value.code == "journal_unusable"
    assert "no batch ledger" in refused.value.message
    assert not (tmp_path / LEDGER_NAME).exists()


def test_a_row_whose_file_leaves_its_folder_is_reported_not_listed(
    gateway: MockGateway, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    batch(gateway, [json.dumps({"prompt": "a fox"}), json.dumps({"prompt": "an owl"})], out)
    with contextlib.closing(sqlite3.connect(out / LEDGER_NAME)) as db, db:
        db.execute("UPDATE tasks SET files = ? WHERE line = 1", ('[{"path": "../../x.png"}]',))
    journal = Journal(out)
    assert [e.request.prompt for e in journal.tasks()] == ["an owl"]
    (bad,) = journal.damaged()
    assert bad.reason == "files is not a list of names in the folder"
    journal.close()


def test_a_folder_of_the_release_before_is_brought_forward_once_and_listed(
    gateway: MockGateway, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fields = json.dumps({"prompt": "a fox", "aspect_ratio": "auto", "resolution": "1K"})
    with contextlib.closing(sqlite3.connect(out / LEDGER_NAME)) as db:
        db.executescript(FORMAT_5_LEDGER)
        db.execute(
            "INSERT INTO lines (identity, line, digest, fields, surface, idempotency_key, "
            "task_id, state, credits, cost, planned, created_at, updated_at) "
            "VALUES ('line:1', 1, 'd', ?, 'beta', 'k-1', '51', 'failed', 3.0, 0.25, 1, 5.0, 6.0)",
            (fields,),
        )
        db.execute("INSERT INTO meta (key, value) VALUES ('plan', '1')")
        db.commit()
    journal = Journal(out)
    (entry,) = journal.tasks()
    assert (entry.task_id, entry.state, entry.charge) == ("51", "failed", 3.0)
    assert entry.request.prompt == "a fox"
    assert entry.created_at is not None
    assert entry.created_at.timestamp() == 5.0
    journal.close()
    with contextlib.closing(sqlite3.connect(out / LEDGER_NAME)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
    assert "lines" not in tables
    assert free == 0  # the old table's pages given back, not kept free in the file
