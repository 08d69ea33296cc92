"""A batch output folder's store is a journal's file (``_journal/schema.py``, DESIGN 24): one
table keeps every paid task, whoever made it. ``Journal(folder)`` lists the run's tasks (its bad
input lines are no tasks) with what a journal's listing shows, and writes nothing: the run does.
A folder left by the release before the one table is listed once its run brought it forward.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import ConfigurationError, PollPolicy, RetryPolicy
from imggw_client._core.states import State
from imggw_client._journal.schema import FORMAT, LEDGER_NAME
from imggw_client.batch import BatchReport, StorageError, ledger_folders, run_batch, run_shard
from imggw_client.batch._ledger import Ledger
from imggw_client.mock import MockGateway
from imggw_client.tracking import Journal

from .ledgers import FORMAT_5_LEDGER, planned, row

RUNNING, FAILED = State.RUNNING, State.FAILED

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
    ledger = (out / LEDGER_NAME).read_bytes()
    journal = Journal(out)
    with pytest.raises(ConfigurationError) as refused:
        journal.prune(older_than=0)
    assert refused.value.code == "journal_unusable"
    assert "can be listed, not written" in refused.value.message
    for given in (journal, out, out / LEDGER_NAME):  # a client never takes one
        with pytest.raises(ConfigurationError, match="a client needs a journal of its own"):
            gateway.client(journal=given, **FAST)
    assert [e.request.prompt for e in journal.tasks()] == ["a fox"]  # still open, still read
    journal.close()

    async def submit() -> None:  # opened on first use: refused at the first write
        async with gateway.async_client(journal=out / LEDGER_NAME, **FAST) as client:
            await client.submit("not from here")

    with pytest.raises(ConfigurationError, match="can be listed, not written"):
        anyio.run(submit)
    assert gateway.stats()["requests"] == before  # nothing was sent
    assert (out / LEDGER_NAME).read_bytes() == ledger


def test_what_a_listing_calls_a_task_is_what_may_have_been_paid_for(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with planned(
        out,
        [
            row(1),  # never sent
            row(2, first_sent=1.7e9),  # sent, its answer lost: it may be a paid task
            row(3, FAILED, first_sent=1.7e9, error_code="invalid_prompt"),  # refused
            row(4, RUNNING, task_id="40", first_sent=1.7e9, credits=-2.0),
            row(5, kind="bad"),
        ],
    ):
        pass
    journal = Journal(out)
    listed = {e.idempotency_key: e for e in journal.tasks()}
    assert set(listed) == {"key-2", "key-4"}
    assert journal.count() == 2
    assert [e.idempotency_key for e in journal.tasks(unfinished=True)] == ["key-4", "key-2"]
    created = listed["key-2"].created_at
    assert created is not None
    assert created.timestamp() == 1.7e9  # when its submit first left, not when it was planned
    journal.close()


def test_a_group_writable_batch_folder_is_listed_and_a_linked_one_is_not(
    gateway: MockGateway, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    batch(gateway, [json.dumps({"prompt": "a fox"})], out)
    out.chmod(0o775)  # a folder made under umask 002: the run's, not a journal to collect from
    journal = Journal(out)
    assert journal.count() == 1
    journal.close()
    (tmp_path / "link").symlink_to(out)
    with pytest.raises(ConfigurationError) as refused:
        Journal(tmp_path / "link")
    assert refused.value.code == "journal_unusable"
    assert "symbolic link" in refused.value.message


def test_a_folder_with_no_ledger_is_no_journal(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Journal(tmp_path)
    assert refused.value.code == "journal_unusable"
    assert "no batch ledger" in refused.value.message
    assert not (tmp_path / LEDGER_NAME).exists()
    (tmp_path / LEDGER_NAME).touch()  # a run killed before its ledger had a table
    with pytest.raises(ConfigurationError, match="no batch ledger"):
        Journal(tmp_path)
    assert (tmp_path / LEDGER_NAME).read_bytes() == b""  # left for its run to make


def test_a_sharded_runs_tasks_are_listed_shard_by_shard_with_the_files_the_run_saved(
    gateway: MockGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"p{n}"}) + "\n" for n in range(1, 6)))
    out = tmp_path / "out"
    for index in (1, 2):
        run_shard(
            source, out, index=index, count=2, client_factory=lambda: gateway.async_client(**FAST)
        )

    folders = ledger_folders(out)
    assert folders == [out / "shards" / "0001-of-0002", out / "shards" / "0002-of-0002"]
    listed = {}
    for folder in folders:
        with contextlib.closing(Journal(folder)) as journal:
            listed[folder.name] = journal.tasks()
    assert sorted(e.request.prompt for entries in listed.values() for e in entries) == [
        f"p{n}" for n in range(1, 6)
    ]
    for entries in listed.values():
        for entry in entries:
            (saved,) = entry.files  # a shard saves its results in the run's folder
            assert Path(saved).parent == out
            assert Path(saved).is_file()

    with pytest.raises(ConfigurationError) as refused:  # the run's folder keeps no ledger
        Journal(out)
    assert refused.value.code == "journal_unusable"
    assert "a sharded run's folder" in refused.value.message
    assert str(folders[0]) in refused.value.message
    assert not (out / LEDGER_NAME).exists()
    monkeypatch.chdir(folders[0])  # a shard's folder named from inside it
    with contextlib.closing(Journal(".")) as journal:
        assert all(Path(e.files[0]).parent == out for e in journal.tasks())
    assert ledger_folders(tmp_path / "nowhere") == []
    assert ledger_folders(tmp_path) == []


def test_the_ledgers_of_a_folder_are_its_own_then_its_shards_by_count_and_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    names = ["9999-of-10000", "10000-of-10000", "0002-of-0002", "0001-of-0002", "0001-of-0003"]
    planted = ["0003-of-0002", "0000-of-0000", "\u0660\u0660\u0660\u0661-of-0002", "1-of-2"]
    for name in names + planted:
        (out / "shards" / name).mkdir(parents=True)
        (out / "shards" / name / LEDGER_NAME).touch()
    (out / "shards" / "0002-of-0003").mkdir()  # a shard never run: no ledger
    assert [f.name for f in ledger_folders(out)] == [
        "0001-of-0002",
        "0002-of-0002",
        "0001-of-0003",
        "9999-of-10000",
        "10000-of-10000",
    ]
    (out / LEDGER_NAME).touch()  # a run of its own in the folder too
    assert ledger_folders(out)[0] == out
    assert len(ledger_folders(out)) == 6
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ledger_folders("~/out") == ledger_folders(out)

    plain = tmp_path / "plain"
    (plain / LEDGER_NAME).mkdir(parents=True)  # no ledger file, and no shards
    assert ledger_folders(plain) == []
    with pytest.raises(ConfigurationError, match="no batch ledger"):
        Journal(plain)

    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "shards").symlink_to(out / "shards")
    with pytest.raises(StorageError, match="symbolic link"):
        ledger_folders(linked)
    with pytest.raises(ConfigurationError, match="symbolic link") as refused:
        Journal(linked)
    assert refused.value.code == "journal_unusable"


def test_a_run_of_its_own_in_a_folder_named_like_a_shard_keeps_its_files(
    gateway: MockGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "mine" / "shards" / "0001-of-0002"
    out.mkdir(parents=True)
    batch(gateway, [json.dumps({"prompt": "a fox"})], out)
    monkeypatch.chdir(out)  # a relative path names the same folder
    for opened in (Journal(out), Journal("."), Journal(LEDGER_NAME)):
        with contextlib.closing(opened) as journal:
            ((saved,),) = [e.files for e in journal.tasks()]
        assert Path(saved).parent == out
        assert Path(saved).is_file()


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


def test_a_folder_of_the_release_before_is_listed_once_its_run_brought_it_forward(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fields = json.dumps({"prompt": "a fox", "aspect_ratio": "auto", "resolution": "1K"})
    with contextlib.closing(sqlite3.connect(out / LEDGER_NAME)) as db:
        db.executescript(FORMAT_5_LEDGER)
        db.execute(
            "INSERT INTO lines (identity, line, digest, fields, surface, idempotency_key, "
            "task_id, state, credits, cost, planned, created_at, updated_at) "
            "VALUES ('line:1', 1, 'd', ?, 'beta', 'k-1', '51', 'failed', 3.0, 0.25, 1, 5.0, 6.0),"
            " ('line:2', 2, 'e', ?, 'beta', 'k-2', '52', 'saved', -1.0, NULL, 1, 7.0, 8.0)",
            (fields, fields),
        )
        db.execute("INSERT INTO meta (key, value) VALUES ('plan', '1')")
        db.commit()
    before = (out / LEDGER_NAME).read_bytes()
    with pytest.raises(ConfigurationError) as refused:  # a listing changes nothing
        Journal(out)
    assert "brings it forward when run again" in refused.value.message
    assert (out / LEDGER_NAME).read_bytes() == before
    with Ledger.open(out):  # as its run opens it, under the folder's lock
        pass
    journal = Journal(out)
    unclamped, entry = journal.tasks()
    assert (entry.task_id, entry.state, entry.charge) == ("51", "failed", 3.0)
    # A charge below 0, kept by versions that did not clamp it, is none spent (as the batch
    # counts it), not a damaged row.
    assert (unclamped.task_id, unclamped.charge) == ("52", 0.0)
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
