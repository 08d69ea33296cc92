"""What the journal's tests share: reading a journal as another process would (a connection of
its own, every row as a dict), the key of their gateway and quick polls."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from imggw_client import PollPolicy

KEY = "sk-journal-3f9a1c7e5b2d8406"
FAST = PollPolicy(initial_interval=0.02, max_interval=0.1)


def rows(path: Path) -> list[dict[str, Any]]:
    """The journal's rows, oldest first, read through a connection of their own."""
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM tasks ORDER BY row")]


class TurkishRowcount:
    """A connection as Python's sqlite3 (3.11) behaves where the C library's ``tolower`` is a
    Turkish locale's: it tells an INSERT by its first word's letters lowered, "I" is then not
    "i", and the INSERT's cursor says ``rowcount`` -1 whether a row was made or not. Every other
    use goes to ``db`` as it is."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        cursor = self._db.execute(sql, parameters)
        return _NoCount(cursor) if sql.lstrip()[:6].upper() == "INSERT" else cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class _NoCount:
    rowcount = -1

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)
