"""A ledger file read while its run may be writing it, and copied while it does
(``batch/_ledger_files.py``): what ``status``, ``merge`` and a shard's checkpoints read."""

from __future__ import annotations

from pathlib import Path

import pytest

from imggw_client._files import StorageError
from imggw_client.batch._ledger import STOPPED_BY
from imggw_client.batch._schema import (
    EXPIRED,
    FAILED,
    LEDGER_NAME,
    RUNNING,
    SAVED,
    SUCCEEDED,
    UNKNOWN,
    checkpoint_number,
    copy_ledger,
    count_statuses,
    read_meta,
    read_rows,
)

from .ledgers import plan, planned, row


def test_a_live_ledger_is_read_by_another_reader_in_line_order(tmp_path: Path) -> None:
    rows = [
        row(3, SAVED, task_id="3"),
        row(1, UNKNOWN),
        row(2, SUCCEEDED, task_id="2"),
        row(4, EXPIRED, task_id="4"),
        row(5, FAILED, kind="bad"),
        row(6, RUNNING, task_id="6"),
    ]
    with planned(tmp_path, rows) as ledger:  # held open and locked, as a run holds it
        path = tmp_path / LEDGER_NAME
        assert [r.line for r in read_rows(path)] == [1, 2, 3, 4, 5, 6]
        assert count_statuses(path) == {
            "pending": 1,
            "running": 2,
            "succeeded": 1,
            "failed": 1,
            "bad": 1,
        }
        ledger.set_meta(STOPPED_BY, "max_cost")
        assert read_meta(path, STOPPED_BY) == "max_cost"
        plan(ledger, [row(1, UNKNOWN)])  # a later plan: only its lines are read
        assert [r.line for r in read_rows(path)] == [1]


def test_what_is_no_ledger_reads_as_nothing_and_a_link_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "none.sqlite"
    assert list(read_rows(missing)) == []
    assert count_statuses(missing) is None
    assert read_meta(missing, STOPPED_BY) is None
    assert checkpoint_number(missing) == -1
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database" * 200)
    assert list(read_rows(junk)) == []
    assert checkpoint_number(junk) == -1
    with planned(tmp_path / "run", [row(1)]):
        pass
    link = tmp_path / "link.sqlite"
    link.symlink_to(tmp_path / "run" / LEDGER_NAME)
    with pytest.raises(StorageError):
        list(read_rows(link))


def test_each_copy_of_a_ledger_is_numbered_one_past_the_last(tmp_path: Path) -> None:
    with planned(tmp_path / "run", [row(1), row(2, SAVED, task_id="2")]) as ledger:
        path = tmp_path / "run" / LEDGER_NAME
        assert checkpoint_number(path) == 0  # never copied
        copy_ledger(path, tmp_path / "copy-1.sqlite")
        ledger.set_meta(STOPPED_BY, "max_failures")
        copy_ledger(path, tmp_path / "copy-2.sqlite")
    assert checkpoint_number(tmp_path / "copy-1.sqlite") == 1
    assert checkpoint_number(tmp_path / "copy-2.sqlite") == 2
    assert [r.line for r in read_rows(tmp_path / "copy-2.sqlite")] == [1, 2]
    assert read_meta(tmp_path / "copy-1.sqlite", STOPPED_BY) is None
    assert read_meta(tmp_path / "copy-2.sqlite", STOPPED_BY) == "max_failures"
    assert (tmp_path / "copy-2.sqlite").stat().st_mode & 0o077 == 0  # private, as the ledger
