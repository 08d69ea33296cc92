"""Reading a journal as another process would: a connection of its own, every row as a dict."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


def rows(path: Path) -> list[dict[str, Any]]:
    """The journal's rows, oldest first, read through a connection of their own."""
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM tasks ORDER BY row")]
