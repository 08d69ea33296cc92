"""A ledger file read while another process may be writing it (``imggw batch status``,
``merge``, a Dask driver's progress), and copied whole while a run writes on (a shard's
checkpoints into a remote output folder). Read only, and never through a symbolic link.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from .._files import StorageError, refuse_link
from ._schema import BAD, COLUMNS, Row, private_database, state_of
from ._states import STATUS, line_state


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[tuple[sqlite3.Connection, int, int] | None]:
    """A ledger file opened read only (a live run, another process, may be writing it), its
    last plan and its format (its rows are read as that format wrote them); None when it holds
    no plan (or is no ledger). A symbolic link planted in its place is refused, not read."""

    refuse_link(path)
    try:
        # A reader left half-read (a merge that stopped early) is closed when the garbage
        # collector finds it, in whatever thread runs then: a read-only connection may be.
        db = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0, check_same_thread=False
        )
    except sqlite3.Error:
        yield None
        return
    with contextlib.closing(db):
        try:
            found = db.execute("SELECT value FROM meta WHERE key='plan'").fetchone()
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error:
            found = None
        yield (db, int(found[0]), version) if found is not None else None


def read_rows(path: Path) -> Iterator[Row]:
    """Every row of a ledger file's last plan, in line order, read only: what ``status`` and
    ``merge`` read of a shard's ledger or checkpoint. Whatever cannot be read ends the rows."""
    with _read_only(path) as opened:
        if opened is None:
            return
        db, plan, version = opened
        try:
            cursor = db.execute(
                f"SELECT {', '.join(COLUMNS)} FROM lines WHERE planned=? ORDER BY line", (plan,)
            )
            for values in cursor:
                yield Row.from_values(values, version)
        except sqlite3.Error:
            return


def count_statuses(path: Path) -> dict[str, int] | None:
    """Lines per word of ``_states.STATUSES`` in a ledger file's last plan (bad input lines
    as ``bad``), read only and summed by SQLite: cheap enough to read every few seconds while
    a shard runs. None when the file holds no plan yet."""
    with _read_only(path) as opened:
        if opened is None:
            return None
        db, plan, version = opened
        found: Counter[str] = Counter()
        for bad, state, n in db.execute(
            "SELECT kind=?, state, COUNT(*) FROM lines WHERE planned=? GROUP BY 1, 2",
            (BAD, plan),
        ):
            found["bad" if bad else STATUS[line_state(state_of(state, version))]] += n
        return dict(found)


# ---------------------------------------------------------------------------- checkpoints

_CHECKPOINT_KEY = "checkpoint"


def checkpoint_number(path: Path) -> int:
    """The checkpoint number a ledger file holds: 0 for a ledger never copied, -1 for no
    ledger there (or none that can be read)."""
    if not path.exists():
        return -1
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            found = db.execute("SELECT value FROM meta WHERE key=?", (_CHECKPOINT_KEY,)).fetchone()
    except sqlite3.Error:
        return -1
    return int(found[0]) if found else 0


def copy_ledger(path: Path, copy: Path) -> None:
    """A consistent copy of the ledger at ``path`` into ``copy``, while a run writes on (SQLite's
    backup API), numbered one past its last checkpoint: a shard's ledger on its way to a
    remote output folder. Blocking."""
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=10.0)) as db:
            number = max(checkpoint_number(path), 0) + 1
            with db:
                db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                    (_CHECKPOINT_KEY, str(number)),
                )
            private_database(copy)
            with contextlib.closing(sqlite3.connect(copy)) as into:
                db.backup(into)
    except sqlite3.Error as exc:
        raise StorageError(
            f"cannot checkpoint {path} ({exc}); the same command resumes", code="storage_failed"
        ) from exc


def read_meta(path: Path, key: str) -> str | None:
    """A value a ledger file keeps beside its lines (``stopped_by``, say), read only."""
    with _read_only(path) as opened:
        if opened is None:
            return None
        db = opened[0]
        try:
            found = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        except sqlite3.Error:
            return None
        return None if found is None else str(found[0])
