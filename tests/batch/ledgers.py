"""Ledgers made by hand for the unit tests of the modules around them: rows in given states,
planned into a ledger in a folder, as a run's plan puts them."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from imggw_client._core.states import State
from imggw_client.batch._admission import Room
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._lines import GENERATE
from imggw_client.batch._schema import UNKNOWN, Row
from imggw_client.batch._store import RunLines

# The ledger's file as format 5 (the last before the store's one table) made it: a folder left
# by that release opens and resumes.
FORMAT_5_LEDGER = """
CREATE TABLE lines (
    identity        TEXT PRIMARY KEY,
    line            INTEGER NOT NULL,
    caller_id       TEXT,
    kind            TEXT NOT NULL DEFAULT 'generate',
    digest          TEXT NOT NULL,
    fields          TEXT NOT NULL DEFAULT '{}',
    surface         TEXT NOT NULL,
    idempotency_key TEXT,
    task_id         TEXT,
    state           TEXT NOT NULL,
    urls            TEXT NOT NULL DEFAULT '[]',
    expires_at      REAL,
    error_code      TEXT,
    error_message   TEXT,
    files           TEXT NOT NULL DEFAULT '[]',
    credits         REAL,
    cost            REAL,
    finished_at     REAL,
    submitted_at    REAL,
    completed_at    REAL,
    first_sent      REAL,
    planned         INTEGER NOT NULL DEFAULT 0,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL
);
CREATE INDEX lines_by_line ON lines (planned, line);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
PRAGMA user_version=5;
"""


def row(line: int, state: State = UNKNOWN, *, resolution: str = "1k", **kw: Any) -> Row:
    """A generate line's row (``kw`` sets any other column)."""
    values: dict[str, Any] = {
        "identity": f"line:{line}",
        "line": line,
        "caller_id": None,
        "kind": GENERATE,
        "digest": f"digest-{line}",
        "surface": "beta",
        "idempotency_key": f"key-{line}",
        "task_id": None,
        "state": state,
        "fields": {"prompt": f"p{line}", "aspect_ratio": "auto", "resolution": resolution},
    }
    values.update(kw)
    return Row(**values)


def plan(ledger: Ledger, rows: Iterable[Row]) -> None:
    """Puts ``rows`` in a plan of their own, committed."""
    ledger.begin_plan()
    for each in rows:
        assert ledger.plan_line(each) is not None
    ledger.end_plan(commit=True)


@contextlib.contextmanager
def planned(folder: Path, rows: Iterable[Row]) -> Iterator[Ledger]:
    """The ledger in ``folder`` (locked, closed after), holding ``rows`` as its last plan."""
    with Ledger.open(folder) as ledger:
        plan(ledger, rows)
        yield ledger


def run_lines(
    ledger: Ledger,
    folder: Path = Path("."),
    *,
    deadline: float = math.inf,
    line_timeout: float | None = None,
    redact: Callable[[str], str] = str,
    room: Room | None = None,
) -> RunLines:
    """The lines of a run over ``ledger``, its results saved in ``folder``: by default with no
    deadline, no line timeout and nothing hidden from its messages. ``room``: the room its
    moves go through when a test shares it with other parts of the run (by default its own,
    over ``folder``)."""
    return RunLines(
        ledger,
        ledger.totals(),
        Room(folder) if room is None else room,
        deadline=deadline,
        line_timeout=line_timeout,
        redact=redact,
    )
