"""The task store's file format, one for every file that keeps paid tasks: an application's
journal, the shell's, and a batch folder's ledger. Its one table (``tasks``), how a file of an
earlier format of either kind is brought forward, whose rows are whose (:class:`Scope`), and the
filters of a listing. ``journal`` opens the file and runs the queries; ``moves`` writes an
event's move; the batch's ``_ledger`` writes its lines.

A row is one paid task (or one that may be: its submit's answer not known yet). A journal's row
belongs to a gateway and a key (``gateway``, ``key_fp``) and keeps the request it asked
(``prompt``, ``aspect_ratio``, ``resolution``) and who holds it (``attempt``, the lease). A batch
folder's row is its run's: no scope (``''``), the request in ``fields``, and the line it came
from (``identity``, ``line``, ``caller_id``, ``kind``, ``digest``, ``planned``), its links,
error, money (``credits``, ``cost``) and times. Every row keeps ``charge``: the task's credits
where the gateway states them, else its cost. The columns one kind leaves unused are NULL.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
from collections.abc import Callable, Collection
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from .._core import states
from .._core.exceptions import RequestValidationError
from .._core.states import State
from .._files import refuse_link

__all__ = [
    "FINAL",
    "FORMAT",
    "LEDGER_NAME",
    "NEWEST_FIRST",
    "OPEN",
    "RENAMED",
    "RUN_NAME",
    "SHARDS_DIR",
    "SHARD_NAME",
    "Scope",
    "is_ledger",
    "ledger_folders",
    "migrate",
    "refuse_newer",
    "results_folder",
    "shard_of",
    "transaction",
    "where",
]

LEDGER_NAME = "ledger.sqlite"  # a batch folder's store, in the folder
# A sharded run keeps one ledger a shard, in shards/0002-of-0004/, and its results in the run's
# folder: a shard's file names are that folder's.
SHARDS_DIR = "shards"
SHARD_NAME = re.compile(r"([0-9]{4,})-of-([0-9]{4,})")  # ASCII digits: a name we made
RUN_NAME = "run.json"  # a run's identity, in its output folder (never in a shard's)
# PRAGMA user_version, one sequence for both kinds of file. A journal was 1, then 2 (the submit
# call that made a row, its last change, its lease). A ledger was 0 or 1 (its own table,
# ``lines``), 2 (kinds, fields, expiries), 3 (states renamed, ``fingerprint`` as ``digest``,
# submit and finish times), 4 (``first_sent``), 5 (the core's states). 6: the one table.
FORMAT = 6
STATES_KEPT = 5  # the first ledger format whose rows keep the core's states
# What ledger rows written before STATES_KEPT keep, and the core's state each is ("submitted"
# was beta's wire word and "done" the first format's; a line that was "succeeded" before the
# third was downloading then, as the core's ``succeeded`` is).
RENAMED: dict[str, State] = {
    "pending": State.UNKNOWN,
    "submitted": State.RUNNING,
    "downloading": State.SUCCEEDED,
    "done": State.SAVED,
}

# The table's columns: the journal's (format 2), then what a batch line adds.
_COLUMNS = (
    ("row", "INTEGER PRIMARY KEY"),
    ("gateway", "TEXT NOT NULL DEFAULT ''"),
    ("key_fp", "TEXT NOT NULL DEFAULT ''"),
    ("surface", "TEXT NOT NULL"),
    ("idempotency_key", "TEXT"),
    ("task_id", "TEXT"),
    ("state", "TEXT NOT NULL"),
    ("prompt", "TEXT NOT NULL DEFAULT ''"),
    ("aspect_ratio", "TEXT NOT NULL DEFAULT ''"),
    ("resolution", "TEXT NOT NULL DEFAULT ''"),
    ("created", "REAL NOT NULL"),
    ("submitted_at", "REAL"),
    ("expires_at", "REAL"),
    ("charge", "REAL"),
    ("files", "TEXT NOT NULL DEFAULT '[]'"),
    ("attempt", "TEXT"),
    ("changed", "REAL"),
    ("lease_owner", "TEXT"),
    ("lease_until", "REAL"),
    ("identity", "TEXT"),
    ("line", "INTEGER"),
    ("caller_id", "TEXT"),
    ("kind", "TEXT"),
    ("digest", "TEXT"),
    ("fields", "TEXT"),
    ("urls", "TEXT"),
    ("error_code", "TEXT"),
    ("error_message", "TEXT"),
    ("credits", "REAL"),
    ("cost", "REAL"),
    ("finished_at", "REAL"),
    ("completed_at", "REAL"),
    ("first_sent", "REAL"),
    ("planned", "INTEGER"),
)
_TABLE = f"CREATE TABLE tasks ({', '.join(f'{name} {kind}' for name, kind in _COLUMNS)})"
# Each kind of file is indexed for what it is asked: a journal by key, task and state within a
# scope, a ledger by line (and a line's identity names its row). A key names one task in a
# journal's scope (a journal made before format 6 keeps this as its table's own constraint).
_JOURNAL_KEY = (
    "CREATE UNIQUE INDEX IF NOT EXISTS tasks_by_key ON tasks "
    "(gateway, key_fp, surface, idempotency_key)"
)
_JOURNAL_INDEXES = (
    "CREATE INDEX IF NOT EXISTS tasks_by_id ON tasks (gateway, key_fp, surface, task_id)",
    "CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (gateway, key_fp, state)",
)
_LEDGER_INDEXES = (
    "CREATE UNIQUE INDEX IF NOT EXISTS tasks_by_identity ON tasks (identity)",
    "CREATE INDEX IF NOT EXISTS tasks_by_line ON tasks (planned, line)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)
# A ledger's columns before FORMAT that its earlier formats lack, with how they are added.
_LEDGER_ADDED = {
    "kind": "TEXT NOT NULL DEFAULT 'generate'",
    "fields": "TEXT NOT NULL DEFAULT '{}'",
    "expires_at": "REAL",
    "finished_at": "REAL",
    "planned": "INTEGER NOT NULL DEFAULT 0",
    "submitted_at": "REAL",
    "completed_at": "REAL",
    "first_sent": "REAL",
}
# The ledger's line columns carried over as they are (format 5's ``lines``).
_CARRIED = (
    "identity, line, caller_id, kind, digest, fields, surface, idempotency_key, task_id, state, "
    "urls, expires_at, error_code, error_message, files, credits, cost, finished_at, "
    "submitted_at, completed_at, first_sent, planned"
)
OPEN = [s.value for s, work in states.WORK.items() if work is not None]
FINAL = [s.value for s, work in states.WORK.items() if work is None]
# Rows are numbered as they are made: the newest first is the table read backwards, with no
# index to keep up on every write and no sort, however many rows there are.
NEWEST_FIRST = " ORDER BY row DESC"
# The rows of a ledger that are (or may be) paid tasks: those with a task id, and those whose
# submit left with no answer known (``unknown`` in a journal means that, and in a listing too).
# A bad input line is none, nor a line never sent, nor one whose submit was refused.
BATCH_TASKS = (
    "kind IS NOT 'bad' AND (task_id IS NOT NULL OR (state = 'unknown' AND first_sent IS NOT NULL))"
)


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


def is_ledger(db: sqlite3.Connection) -> bool:
    """Whether the file is a batch folder's ledger (it keeps a run's ``meta``, or is a ledger
    of an earlier format), not a journal."""
    found = db.execute(
        "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name IN ('meta', 'lines')"
    ).fetchone()
    return bool(found[0])


def migrate(
    db: sqlite3.Connection,
    *,
    ledger: bool = False,
    redigest: Callable[[str, str, str], str | None] | None = None,
) -> None:
    """Makes the schema of a new file (a ledger's with ``ledger``), or brings a file of an
    earlier format forward, in one transaction (another process may be opening it too);
    refuses a newer one. ``redigest``: a first-format ledger row's digest in today's terms,
    from its request (JSON), surface and digest (None: kept as it is)."""
    if refuse_newer(db) == FORMAT:
        return
    moved = False
    with transaction(db):
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version < FORMAT:
            ledger = ledger or is_ledger(db)
            have = {r[1] for r in db.execute("PRAGMA table_info(tasks)")}
            for name, kind in _COLUMNS:  # a journal of format 1 or 2: the columns it lacks
                if have and name not in have:
                    db.execute(f"ALTER TABLE tasks ADD COLUMN {name} {kind}")
            if not have:
                db.execute(_TABLE)
                if not ledger:
                    db.execute(_JOURNAL_KEY)
            if ledger:
                moved = _ledger_forward(db, version, redigest)
            for statement in _LEDGER_INDEXES if ledger else _JOURNAL_INDEXES:
                db.execute(statement)
            db.execute(f"PRAGMA user_version={FORMAT}")
    if moved:  # the old table's pages, free now: the file back to the size of its rows, once
        _give_back(db)


def _give_back(db: sqlite3.Connection) -> None:
    """The file rewritten at the size of its rows, and its log (which held the rewrite) cut
    back, if that can be done now: worth having, never worth failing an open for (a disk with
    no room for the copy), nor making a reader's snapshot hold a writer up (no busy wait)."""
    waits = db.execute("PRAGMA busy_timeout").fetchone()[0]
    with suppress(sqlite3.Error):
        db.execute("VACUUM")
        db.execute("PRAGMA busy_timeout=0")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    db.execute(f"PRAGMA busy_timeout={int(waits)}")


def _ledger_forward(
    db: sqlite3.Connection, version: int, redigest: Callable[[str, str, str], str | None] | None
) -> bool:
    """A ledger's ``lines`` of any earlier format brought into the one table (its rows kept,
    their states made the core's), and ``lines`` dropped; whether there were any."""
    have = {r[1] for r in db.execute("PRAGMA table_info(lines)")}
    if not have:
        return False
    if "fingerprint" in have:
        db.execute("ALTER TABLE lines RENAME COLUMN fingerprint TO digest")
    for name, kind in _LEDGER_ADDED.items():
        if name not in have:
            db.execute(f"ALTER TABLE lines ADD COLUMN {name} {kind}")
    if "request" in have:  # the first format kept the request under this name
        db.execute("UPDATE lines SET fields = request WHERE fields = '{}'")
        # ... and its digest left out the line's kind: the same input would find every line
        # changed, and send each again under a new key (a second bill).
        if redigest is not None:
            for rowid, request, surface, digest in db.execute(
                "SELECT rowid, request, surface, digest FROM lines"
            ).fetchall():
                digest = redigest(request, surface, digest)
                if digest is not None:
                    db.execute("UPDATE lines SET digest=? WHERE rowid=?", (digest, rowid))
    if version < STATES_KEPT:  # once: the rows' states become the core's
        cases = " ".join(f"WHEN '{old}' THEN '{new.value}'" for old, new in RENAMED.items())
        db.execute(f"UPDATE lines SET state = CASE state {cases} ELSE state END")
    db.execute(
        f"INSERT INTO tasks ({_CARRIED}, charge, created, changed) "
        # A charge below 0 (kept by versions that did not clamp it) is 0, as the batch counts it.
        f"SELECT {_CARRIED}, MAX(COALESCE(credits, cost), 0), created_at, updated_at FROM lines "
        "ORDER BY rowid"
    )
    db.execute("DROP TABLE lines")
    return True


class transaction:  # lower case: used as a function, `with transaction(db):`
    """The one way a store's file is written: one transaction that takes the write lock at
    once (``BEGIN IMMEDIATE``: no upgrade from a read to fail halfway), committed whole, or
    undone on any error. A class, not a generator: a journal writes a few times a task, and
    this costs a third of what ``contextmanager`` does."""

    __slots__ = ("db",)

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            try:
                self.db.execute("COMMIT")
                return
            except BaseException:
                self._undo()
                raise
        self._undo()

    def _undo(self) -> None:
        if self.db.in_transaction:  # a failed COMMIT may have ended it already
            with suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")


def where(
    unfinished: bool,
    scope: Scope | None,
    wanted: Collection[str] | None,
    *,
    limit: object = None,
    ledger: bool = False,
) -> tuple[str, list[Any]]:
    """The WHERE clause (with its leading space, or none) and its arguments of a listing:
    ``unfinished`` rows only, one ``scope``'s, rows in the ``wanted`` states, in a ``ledger``
    the rows that are tasks (:data:`BATCH_TASKS`); ``limit``: the
    listing takes the newest few only (read backwards by row, each row's scope checked: through
    an index, every row of the scope would be sorted first, 48 ms for 50 of 100,000, not 1).
    States and the limit are checked (:class:`RequestValidationError`)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        refuse("limit", "must be a whole number >= 0, or None")
    newest = limit is not None
    clauses: list[str] = [BATCH_TASKS] if ledger else []
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


def results_folder(ledger: Path) -> Path:
    """The folder a ledger's file names are in: its own, or, for a shard's (a shard folder
    with no run of its own in it), its run's folder."""
    folder = Path(os.path.abspath(ledger)).parent
    in_shards = folder.parent.name == SHARDS_DIR and shard_of(folder) is not None
    if in_shards and not (folder / RUN_NAME).exists():
        return folder.parent.parent
    return folder


def ledger_folders(folder: str | os.PathLike[str]) -> list[Path]:
    """The folders whose ledgers keep a batch output ``folder``'s tasks: the folder itself
    (a run of its own), then its shards' folders, by shard count and index (none: no batch
    has run there). Each opens as a :class:`~imggw_client.tracking.Journal` that lists its
    tasks. A ``shards`` folder that is a symbolic link raises :class:`StorageError`.

    Example::

        for i in (1, 2):
            run_shard("prompts.jsonl", "out/", index=i, count=2)
        for folder in ledger_folders("out/"):                # out/shards/0001-of-0002, ...
            print(folder.name, [e.task_id for e in Journal(folder).tasks()])
    """
    folder = Path(os.path.expanduser(os.fspath(folder)))
    found = [folder] if (folder / LEDGER_NAME).is_file() else []
    shards = folder / SHARDS_DIR
    refuse_link(shards)  # planted: its ledgers are someone else's
    if not shards.is_dir():
        return found
    by_cut = [(n[::-1], p) for p in shards.iterdir() if (n := shard_of(p)) is not None]
    return found + [p for _, p in sorted(by_cut) if (p / LEDGER_NAME).is_file()]


def shard_of(folder: str | os.PathLike[str]) -> tuple[int, int] | None:
    """The shard a folder of :func:`ledger_folders` is, as ``(index, count)``: ``(2, 4)`` for
    ``shards/0002-of-0004``; None for a run's own folder (or any other).

    Example::

        run_shard("prompts.jsonl", "out/", index=1, count=2)
        assert [shard_of(f) for f in ledger_folders("out/")] == [(1, 2)]
    """
    match = SHARD_NAME.fullmatch(Path(folder).name)
    if match is None:
        return None
    index, count = int(match[1]), int(match[2])
    return (index, count) if 1 <= index <= count else None
