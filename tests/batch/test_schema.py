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
from imggw_client.batch._schema import (
    LEDGER_NAME,
    SCHEMA_VERSION,
    Row,
    connect,
    damaged_ledger,
    is_damaged,
    migrate,
    private_database,
    state_of,
    storage_error,
)
from imggw_client.batch._states import DOWNLOADING, RUNNING, SAVED

from .ledgers import row


def test_a_row_is_stored_and_read_back_whole_and_old_state_names_are_read() -> None:
    stored = row(3, SAVED, task_id="42", caller_id="hero", urls=["https://x/1.png"],
                 files=[{"path": "42-0.png", "sha256": "ab", "size": 3}], credits=4.0,
                 cost=None, fields={"prompt": "un renard d'\u00e9t\u00e9 \U0001f98a", "resolution": "2k"})  # fmt: skip
    assert Row.from_values(stored.values()) == stored
    assert state_of("submitted") is RUNNING
    assert state_of("succeeded") is DOWNLOADING
    assert state_of("done") is SAVED
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
