"""The ledger's file (``batch/_schema.py``): a row as stored and read back, a ledger from a
newer imggw refused, a new one made private and never through a link, and the errors of a
damaged or failing one."""

from __future__ import annotations

import contextlib
import sqlite3
import stat
from pathlib import Path

import pytest

from imggw_client._files import StorageError
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._schema import (
    COLUMNS,
    FAILED,
    LEDGER_NAME,
    RUNNING,
    SAVED,
    SCHEMA_VERSION,
    SUCCEEDED,
    UNKNOWN,
    Row,
    connect,
    count_statuses,
    damaged_ledger,
    is_damaged,
    migrate,
    private_database,
    read_rows,
    state_of,
    storage_error,
)

from .ledgers import row


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
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert {"lines", "meta"} <= tables


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
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with contextlib.closing(connect(path)) as db, pytest.raises(StorageError) as raised:
        migrate(db, path)
    assert raised.value.code == "ledger_too_new"
    assert f"ledger format {SCHEMA_VERSION + 1}" in raised.value.message
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


def _old_ledger(path: Path, version: int, states: list[str]) -> None:
    """A ledger as format ``version`` left it: one planned line per state, in that order."""
    values = row(1).values()
    with contextlib.closing(connect(path)) as db:
        migrate(db, path)
        db.execute(f"PRAGMA user_version={version}")
        for n, state in enumerate(states, 1):
            line = (f"line:{n}", n, *values[2:9], state, *values[10:])
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
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        stored = [state for (state,) in db.execute("SELECT state FROM lines ORDER BY line")]
    assert stored == ["unknown", "running", "succeeded", "saved", "failed"]
    with Ledger.open(out) as ledger:  # a ledger of this format is not moved again
        assert [r.state for r in ledger.rows()] == kept
