"""The journal's file format: its one table, how a file of an earlier format is brought
forward, whose rows are whose (:class:`Scope`), and the filters of a listing. ``_journal``
opens the file and runs the queries; ``_moves`` writes an event's move.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Collection
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, NoReturn

from .._core import states
from .._core.exceptions import RequestValidationError
from .._core.states import State

__all__ = [
    "FINAL",
    "FORMAT",
    "NEWEST_FIRST",
    "OPEN",
    "Scope",
    "migrate",
    "refuse_newer",
    "rollback",
    "where",
]

FORMAT = 2  # 2 added the submit call that made a row, its last change, and its lease

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    row INTEGER PRIMARY KEY,
    gateway TEXT NOT NULL,
    key_fp TEXT NOT NULL,
    surface TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    task_id TEXT,
    state TEXT NOT NULL,
    prompt TEXT NOT NULL,
    aspect_ratio TEXT NOT NULL,
    resolution TEXT NOT NULL,
    created REAL NOT NULL,
    submitted_at REAL,
    expires_at REAL,
    charge REAL,
    files TEXT NOT NULL DEFAULT '[]',
    attempt TEXT,
    changed REAL,
    lease_owner TEXT,
    lease_until REAL,
    UNIQUE (gateway, key_fp, surface, idempotency_key)
);
CREATE INDEX IF NOT EXISTS tasks_by_id ON tasks (gateway, key_fp, surface, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (gateway, key_fp, state)
"""
# Columns format 1 lacks; its rows get NULL: made by no submit this code can name (so no
# refusal removes them), never changed since, held by no one.
_ADDED = ("attempt TEXT", "changed REAL", "lease_owner TEXT", "lease_until REAL")
OPEN = [s.value for s, work in states.WORK.items() if work is not None]
FINAL = [s.value for s, work in states.WORK.items() if work is None]
# Rows are numbered as they are made: the newest first is the table read backwards, with no
# index to keep up on every write and no sort, however many rows there are.
NEWEST_FIRST = " ORDER BY row DESC"


@dataclass(frozen=True)
class Scope:
    """Whose tasks: one gateway and one API key (by its slow fingerprint, never the key)."""

    gateway: str
    key_fingerprint: str


def refuse_newer(db: sqlite3.Connection) -> int:
    """The file's format; a newer one than this code writes is refused (before anything of the
    file is changed)."""
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    if version > FORMAT:
        raise sqlite3.DatabaseError(f"written by a newer imggw (format {version})")
    return version


def migrate(db: sqlite3.Connection) -> None:
    """Makes the schema of a new file, or brings a format 1 file forward (in one transaction:
    another process may be opening it too); refuses a newer one."""
    if refuse_newer(db) == FORMAT:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version < FORMAT:
            have = {r[1] for r in db.execute("PRAGMA table_info(tasks)")}
            if have:
                for column in _ADDED:
                    if column.split()[0] not in have:
                        db.execute(f"ALTER TABLE tasks ADD COLUMN {column}")
            for statement in _SCHEMA.split(";"):
                db.execute(statement)
            db.execute(f"PRAGMA user_version={FORMAT}")
        db.execute("COMMIT")
    except BaseException:
        rollback(db)
        raise


def rollback(db: sqlite3.Connection) -> None:
    """Ends ``db``'s transaction, if one is open, undone."""
    if db.in_transaction:
        with suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def where(
    unfinished: bool, scope: Scope | None, wanted: Collection[str] | None, *, limit: object = None
) -> tuple[str, list[Any]]:
    """The WHERE clause (with its leading space, or none) and its arguments of a listing:
    ``unfinished`` rows only, one ``scope``'s, rows in the ``wanted`` states; ``limit``: the
    listing takes the newest few only (read backwards by row, each row's scope checked: through
    an index, every row of the scope would be sorted first, 48 ms for 50 of 100,000, not 1).
    States and the limit are checked (:class:`RequestValidationError`)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        refuse("limit", "must be a whole number >= 0, or None")
    newest = limit is not None
    clauses: list[str] = []
    args: list[Any] = []
    if wanted is not None:
        if isinstance(wanted, str) or not all(isinstance(s, str) for s in wanted):
            refuse("states", "must be a collection of state names")
        names = {str(s.value) if isinstance(s, State) else s for s in wanted}
        unknown = sorted(names - {s.value for s in State})
        if unknown:
            known = ", ".join(s.value for s in State)
            refuse("states", f"has unknown states {unknown}: known are {known}")
        chosen = sorted(names)
        clauses.append(f"state IN ({','.join('?' * len(chosen))})" if chosen else "0")
        args += chosen
    if unfinished:
        clauses.append(f"state IN ({','.join('?' * len(OPEN))})")
        args += OPEN
    if scope is not None:
        clauses += ["+gateway = ?" if newest else "gateway = ?", "key_fp = ?"]
        args += [scope.gateway, scope.key_fingerprint]
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def seconds(name: str, value: object) -> float:
    """``value``, checked to be a number of seconds >= 0 (:class:`RequestValidationError`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        refuse(name, "must be seconds >= 0")
    if not (math.isfinite(value) and value >= 0):
        refuse(name, "must be seconds >= 0")
    return float(value)


def refuse(name: str, rule: str) -> NoReturn:
    """An argument of a journal method that breaks ``rule``."""
    raise RequestValidationError(name, rule, code="invalid_option")
