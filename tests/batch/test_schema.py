"""The ledger's file and its rows' states (``batch/_schema.py``): a row as stored and read back,
a ledger from a newer imggw refused, a new one made private and never through a link, the errors
of a damaged or failing one; the core's states, the moves a run makes, the words outside the
ledger, and the one map from how lines ended to the exit code; and a ledger file read while its
run may be writing it, and copied while it does (what ``status``, ``merge`` and a shard's
checkpoints read).
"""

from __future__ import annotations

import contextlib
import sqlite3
import stat
from pathlib import Path

import pytest

from imggw_client._core import states as task
from imggw_client._files import StorageError
from imggw_client._journal.schema import FORMAT
from imggw_client.batch._ledger import STOPPED_BY, Ledger
from imggw_client.batch._schema import (
    BATCH_MOVES,
    COLUMNS,
    EXPIRED,
    FAILED,
    FINAL,
    KEPT,
    LEDGER_NAME,
    MOVES,
    RECHECKS,
    RUNNING,
    SAVED,
    STATUS,
    STATUSES,
    SUCCEEDED,
    UNKNOWN,
    WORDS,
    ExitCode,
    LineState,
    Row,
    charged_apart,
    checkpoint_number,
    connect,
    copy_ledger,
    count_statuses,
    damaged_ledger,
    exit_code,
    is_damaged,
    line_counts,
    line_state,
    migrate,
    private_database,
    read_meta,
    read_rows,
    state_of,
    statuses,
    storage_error,
    words,
)

from .ledgers import FORMAT_5_LEDGER, plan, planned, row


def test_a_row_is_stored_and_read_back_whole_and_old_state_names_are_read() -> None:
    stored = row(
        3,
        SAVED,
        task_id="42",
        caller_id="hero",
        urls=["https://x/1.png"],
        files=[{"path": "42-0.png", "sha256": "ab", "size": 3}],
        credits=4.0,
        cost=None,
        fields={"prompt": "un renard d'\u00e9t\u00e9 \U0001f98a", "resolution": "2k"},
    )
    assert Row.from_values(stored.values()) == stored
    # Rows of the formats before the core's states were kept are read as the core's states.
    assert state_of("submitted", 4) is RUNNING
    assert state_of("succeeded", 2) is SUCCEEDED
    assert state_of("downloading", 4) is SUCCEEDED
    assert state_of("pending", 4) is UNKNOWN
    assert state_of("done", 2) is SAVED
    assert state_of("saved", 4) is SAVED
    assert state_of("saved") is SAVED
    assert row(1, kind="bad").is_bad
    assert not stored.is_bad


def test_a_new_ledger_is_private_made_whole_and_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_NAME
    private_database(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with contextlib.closing(connect(path)) as db:
        migrate(db, path)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert {"tasks", "meta"} <= tables
    assert "lines" not in tables


def test_a_link_planted_beside_the_ledger_is_refused(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_NAME
    (tmp_path / f"{LEDGER_NAME}-wal").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StorageError) as raised:
        private_database(path)
    assert raised.value.code == "symlink_refused"
    assert not path.exists()


def test_a_ledger_from_a_newer_imggw_is_refused_saying_to_upgrade(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_NAME
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA user_version={FORMAT + 1}")
    with contextlib.closing(connect(path)) as db, pytest.raises(StorageError) as raised:
        migrate(db, path)
    assert raised.value.code == "ledger_too_new"
    assert f"ledger format {FORMAT + 1}" in raised.value.message
    assert "upgrade imggw to resume this run" in raised.value.message


def test_a_damaged_ledger_names_the_safe_remedy_and_a_failing_disk_does_not(
    tmp_path: Path,
) -> None:
    path = tmp_path / LEDGER_NAME
    path.write_bytes(b"this is not a database, it is a cut copy" * 100)
    with contextlib.closing(sqlite3.connect(path)) as db, pytest.raises(sqlite3.Error) as raised:
        db.execute("SELECT * FROM lines")
    assert is_damaged(raised.value)
    damaged = storage_error(tmp_path, raised.value)
    assert damaged.code == "ledger_damaged"
    assert damaged.message == damaged_ledger(path, raised.value).message
    assert f"remove {LEDGER_NAME}, {LEDGER_NAME}-wal and {LEDGER_NAME}-shm" in damaged.message
    assert "(keep run.json)" in damaged.message
    assert "never billed twice" in damaged.message
    full = storage_error(path, OSError(28, "No space left on device"))
    assert not is_damaged(OSError(28, "No space left on device"))
    assert full.code == "storage_failed"
    assert "No space left on device" in full.message


@pytest.mark.parametrize(
    "tampered",
    [
        "state='bogus'",
        "fields='x'",
        "fields='[1]'",
        "files='{}'",
        "expires_at=1e300",
        "credits=1e999",  # SQLite keeps it as Infinity, which no JSON reader takes
        "task_id=x'07'",  # a blob, where text is kept
        "digest=NULL",
        "task_id=NULL, state='running'",  # waited on for good: nothing to ask about
        "task_id=NULL, kind='collect'",
    ],
)
def test_a_row_no_run_wrote_is_a_damaged_ledger_not_a_crash(tmp_path: Path, tampered: str) -> None:
    with planned(tmp_path, [row(1), row(2)]):
        pass
    with contextlib.closing(sqlite3.connect(tmp_path / LEDGER_NAME)) as db:
        db.execute(f"UPDATE tasks SET {tampered} WHERE line=1")
        db.commit()
    with Ledger.open(tmp_path) as ledger, pytest.raises(StorageError) as raised:
        ledger.rows()
    assert raised.value.code == "ledger_damaged"
    assert "its row 'line:1'" in raised.value.message
    assert "Deleting it is safe" in raised.value.message


def test_a_ledger_that_cannot_be_read_is_never_read_as_nothing_charged(tmp_path: Path) -> None:
    # What a Dask run's guard starts from: read as 0, an unreadable ledger let a cap pass.
    with planned(tmp_path, [row(1)]):
        pass
    with contextlib.closing(sqlite3.connect(tmp_path / LEDGER_NAME)) as db:
        db.execute("ALTER TABLE tasks DROP COLUMN credits")
        db.commit()
    with pytest.raises(StorageError) as raised:
        charged_apart(tmp_path / LEDGER_NAME)
    assert raised.value.code == "storage_failed"
    assert "cannot read" in raised.value.message


def _old_ledger(path: Path, version: int, states: list[str]) -> None:
    """A ledger as format ``version`` left it: one planned line per state, in that order."""
    values = row(1).values()
    with contextlib.closing(connect(path)) as db:
        db.executescript(FORMAT_5_LEDGER)
        db.execute(f"PRAGMA user_version={version}")
        for n, state in enumerate(states, 1):
            line = (f"line:{n}", n, *values[2:8], str(n), state, *values[10:])  # its task: n
            db.execute(
                f"INSERT INTO lines ({', '.join(COLUMNS)}, planned, created_at, updated_at) "
                f"VALUES ({', '.join('?' * (len(COLUMNS) + 3))})",
                (*line, 1, 0.0, 0.0),
            )
        db.execute("INSERT INTO meta (key, value) VALUES ('plan', '1')")
        db.commit()


@pytest.mark.parametrize(
    ("version", "states"),
    [
        (4, ["pending", "running", "downloading", "saved", "failed"]),
        (2, ["pending", "submitted", "succeeded", "done", "failed"]),
    ],
)
def test_an_older_ledger_keeps_the_cores_states_once_opened_and_is_read_as_them_before(
    tmp_path: Path, version: int, states: list[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    path = out / LEDGER_NAME
    _old_ledger(path, version, states)
    kept = [UNKNOWN, RUNNING, SUCCEEDED, SAVED, FAILED]
    # Read only (a status while an older run holds the folder): translated, never rewritten.
    assert [r.state for r in read_rows(path)] == kept
    assert count_statuses(path) == {"pending": 1, "running": 2, "succeeded": 1, "failed": 1}
    with Ledger.open(out) as ledger:  # opened to run: its rows are moved in place, once
        assert [r.state for r in ledger.rows()] == kept
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT
        stored = [state for (state,) in db.execute("SELECT state FROM tasks ORDER BY line")]
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert stored == ["unknown", "running", "succeeded", "saved", "failed"]
    assert "lines" not in tables  # its rows moved into the store's one table
    with Ledger.open(out) as ledger:  # a ledger of this format is not moved again
        assert [r.state for r in ledger.rows()] == kept


def test_a_run_moves_lines_forward_and_final_lines_nowhere_but_a_lost_file_back() -> None:
    assert set(MOVES) == set(KEPT)
    assert MOVES[UNKNOWN] == {RUNNING, SUCCEEDED, FAILED}  # a replay may answer finished
    assert MOVES[RUNNING] == {SUCCEEDED, FAILED}  # never back to unknown
    assert MOVES[SUCCEEDED] == {SAVED, FAILED, EXPIRED}
    assert MOVES[SAVED] == {SUCCEEDED}  # files gone: downloaded again
    assert MOVES[FAILED] == frozenset()
    assert MOVES[EXPIRED] == {SAVED}  # a refreshed link saved after all
    assert {SAVED, FAILED, EXPIRED} == FINAL
    # What a rerun moves back is never what the run itself may do, and never a submit again
    # for a line that has a task.
    for rule in RECHECKS:
        assert rule.to not in MOVES[rule.state]
        assert rule.to is not UNKNOWN or not rule.task_id


def test_line_moves_and_work_are_read_off_the_cores_one_table() -> None:
    # MOVES itself is pinned move by move above; here, what the batch adds to the core's table.
    # Every move of a run is a move of the core's table, or one of the two a batch adds; a
    # refused submit and a forgotten task are kept as failed lines, a queued task as running.
    def kept(target: task.State | None) -> task.State:
        if target is None or target is task.State.NOT_FOUND:
            return FAILED
        return RUNNING if target is task.State.PENDING else target

    by_the_table = {
        (state, kept(task.move(state, event))) for state in KEPT for event in task.Event
    }
    assert not BATCH_MOVES & by_the_table  # the batch adds only what the table lacks
    assert {(SUCCEEDED, FAILED), (SAVED, SUCCEEDED)} == BATCH_MOVES
    # A line's work is its state's; a recheck's target is the kept state with its work.
    assert {state: task.WORK[state] for state in KEPT} == {
        UNKNOWN: task.Work.RESEND,
        RUNNING: task.Work.WAIT,
        SUCCEEDED: task.Work.DOWNLOAD,
        SAVED: None,
        FAILED: None,
        EXPIRED: None,
    }
    assert [rule.to for rule in RECHECKS] == [SUCCEEDED, SUCCEEDED, RUNNING, UNKNOWN]
    assert all(task.WORK[rule.to] is rule.work for rule in RECHECKS)
    # A task state the core adds shows up here at once: every one has its line's word.
    assert {line_state(state) for state in task.State} == set(LineState)


def test_every_state_has_one_word_outside_the_ledger_and_one_on_the_display() -> None:
    assert [line_state(state) for state in KEPT] == [
        LineState.PENDING,
        LineState.RUNNING,
        LineState.DOWNLOADING,
        LineState.SAVED,
        LineState.FAILED,
        LineState.EXPIRED,
    ]
    assert set(STATUS) == set(LineState)
    assert set(STATUS.values()) == set(STATUSES)
    assert sorted(s for of in WORDS.values() for s in of) == sorted(LineState)
    assert f"{LineState.RUNNING}" == str(LineState.RUNNING) == "running"


def test_counts_become_words_and_statuses_zeros_included() -> None:
    counts = {UNKNOWN: 1, RUNNING: 2, SUCCEEDED: 3, SAVED: 4, EXPIRED: 5, FAILED: 0}
    shown = line_counts(counts)
    assert shown == {"pending": 1, "running": 2, "downloading": 3, "saved": 4, "expired": 5}
    assert words(shown) == {
        "pending": 1,
        "running": 2,
        "downloading": 3,
        "succeeded": 4,
        "failed": 5,
    }
    assert statuses(shown) == {"pending": 1, "running": 5, "succeeded": 4, "failed": 5}
    assert statuses({"saved": 2}) == {"pending": 0, "running": 0, "succeeded": 2, "failed": 0}


def test_the_exit_code_a_guard_then_unfinished_then_failed_then_ok() -> None:
    assert exit_code({"succeeded": 3}) is ExitCode.OK
    assert exit_code({"succeeded": 3}, bad=1) is ExitCode.SOME_FAILED
    assert exit_code({"failed": 1, "running": 1}) is ExitCode.UNFINISHED
    assert exit_code({"pending": 1}, stopped_by="max_cost") is ExitCode.STOPPED
    assert [int(code) for code in ExitCode] == [0, 1, 3, 6]


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


@pytest.mark.parametrize("value", ['"x"', "[4, 0]", '{"7": [-1, 0]}', '{"7": ["4", 0]}', "{"])
def test_replaced_charges_no_run_wrote_are_a_damaged_ledger(tmp_path: Path, value: str) -> None:
    # Read as a lower spend, a cap would let more be paid for than its owner allowed.
    with planned(tmp_path, [row(1)]) as ledger:
        ledger.set_meta("replaced_charges", value)
        with pytest.raises(StorageError) as raised:
            ledger.spent()
    assert raised.value.code == "ledger_damaged"
