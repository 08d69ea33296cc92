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
