"""The ledger's file: its schema and how older formats are brought forward, how it is opened
(SQLite in WAL mode, made private, its log kept small), what one of its rows is (:class:`Row`),
and the errors of a ledger that is damaged or cannot be written. ``_ledger`` runs the queries;
``_ledger_files`` reads and copies a ledger file another process may be writing.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core.states import State
from .._files import StorageError, cannot, make_private, open_private, refuse_link
from ._lines import COLLECT

LEDGER_NAME = "ledger.sqlite"
# PRAGMA user_version: 0 or 1 the first format; 2 added kinds, fields, expiries; 3 renamed the
# states (see RENAMED) and `fingerprint` to `digest`, and added when a task was
# submitted and first seen finished; 4 added when a line's submit first left (`first_sent`);
# 5 keeps the core's task states (`_core/states.py`) in place of the line's own (see RENAMED).
SCHEMA_VERSION = 5
STATES_KEPT = 5  # the first format whose rows keep the core's states
# What rows written before STATES_KEPT keep, and the core's state each is: the one mapping from
# every earlier format ("submitted" was beta's wire word and "done" the first format's; a line
# that was "succeeded" before the third was downloading then, as the core's `succeeded` is).
RENAMED: dict[str, State] = {
    "pending": State.UNKNOWN,
    "submitted": State.RUNNING,
    "downloading": State.SUCCEEDED,
    "done": State.SAVED,
}
BAD = "bad"  # the kind of a bad input line's row (the others: _lines.GENERATE, COLLECT)

COLUMNS = (
    "identity",
    "line",
    "caller_id",
    "kind",
    "digest",
    "fields",
    "surface",
    "idempotency_key",
    "task_id",
    "state",
    "urls",
    "expires_at",
    "error_code",
    "error_message",
    "files",
    "credits",
    "cost",
    "finished_at",
    "submitted_at",
    "completed_at",
    "first_sent",
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS lines (
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
CREATE INDEX IF NOT EXISTS lines_by_line ON lines (planned, line);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Columns that earlier formats lack, with how they are added.
_ADDED = {
    "kind": "TEXT NOT NULL DEFAULT 'generate'",
    "fields": "TEXT NOT NULL DEFAULT '{}'",
    "expires_at": "REAL",
    "finished_at": "REAL",
    "planned": "INTEGER NOT NULL DEFAULT 0",
    "submitted_at": "REAL",
    "completed_at": "REAL",
    "first_sent": "REAL",
}


# What SQLite says of a file that is no (whole) database: damaged, as a kill -9 mid-write on a
# disk that reorders writes, or a copy cut short, can leave it. No fix of the disk mends it.
_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")


def is_damaged(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite finding a damaged database (not a full or failing disk)."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    return isinstance(exc, sqlite3.DatabaseError) and name.startswith(_DAMAGED)


def damaged_ledger(path: Path | str, exc: BaseException) -> StorageError:
    """The error of a ledger SQLite finds damaged: it names the safe remedy. The ledger is a
    record, not the source of the keys: every line's idempotency key follows from the run's
    ``run.json``, so a run without a ledger sends the same keys again and the gateway replays
    the tasks it made instead of billing them again."""
    ledger = Path(path)
    if ledger.name != LEDGER_NAME:  # named by its folder
        ledger = ledger / LEDGER_NAME
    why = str(exc) or type(exc).__name__
    return StorageError(
        f"the batch ledger {ledger} is damaged ({why}). Deleting it is safe: remove "
        f"{LEDGER_NAME}, {LEDGER_NAME}-wal and {LEDGER_NAME}-shm in {ledger.parent} (keep "
        "run.json), then run the same command: every line's key follows from the run, so "
        "tasks already made are replayed by the gateway and downloaded, never billed twice",
        code="ledger_damaged",
    )


def storage_error(path: Path | str, exc: BaseException, verb: str = "write") -> StorageError:
    if is_damaged(exc):
        return damaged_ledger(path, exc)
    return cannot(path, exc, verb)


@dataclass(slots=True)
class Row:
    """One input line as the ledger keeps it: what it asks for (``digest`` of its request,
    ``fields`` for the manifest), its key, its task and where it stands (``state``, see
    ``_states``), its results, money and times (``submitted_at``: its submit was answered;
    ``completed_at``: its task was first seen finished; ``finished_at``: the line reached a
    final state; ``first_sent``: its submit first left, for the gateway's key memory; Unix
    seconds)."""

    identity: str
    line: int
    caller_id: str | None
    kind: str
    digest: str
    fields: dict[str, Any]
    surface: str
    idempotency_key: str | None
    task_id: str | None
    state: State
    urls: list[str] = field(default_factory=list)
    expires_at: float | None = None
    error_code: str | None = None
    error_message: str | None = None
    files: list[dict[str, Any]] = field(default_factory=list)
    credits: float | None = None
    cost: float | None = None
    finished_at: float | None = None
    submitted_at: float | None = None
    completed_at: float | None = None
    first_sent: float | None = None

    def values(self) -> tuple[Any, ...]:
        return (
            self.identity,
            self.line,
            self.caller_id,
            self.kind,
            self.digest,
            json.dumps(self.fields, ensure_ascii=False),
            self.surface,
            self.idempotency_key,
            self.task_id,
            self.state.value,
            json.dumps(self.urls),
            self.expires_at,
            self.error_code,
            self.error_message,
            json.dumps(self.files),
            self.credits,
            self.cost,
            self.finished_at,
            self.submitted_at,
            self.completed_at,
            self.first_sent,
        )

    @classmethod
    def from_values(cls, values: tuple[Any, ...], version: int = SCHEMA_VERSION) -> Row:
        """The row of a ledger's stored ``values`` (written in format ``version``)."""
        named = dict(zip(COLUMNS, values, strict=True))
        for name in ("fields", "urls", "files"):
            named[name] = json.loads(named[name])
        named["state"] = state_of(named["state"], version)
        return cls(**named)

    @property
    def made_here(self) -> bool:
        """A line the run submits (False: a ``task_id`` line, a task made elsewhere: waited on
        and downloaded, never submitted, and asked about once if the gateway does not know
        it)."""
        return self.kind != COLLECT

    @property
    def is_bad(self) -> bool:
        """A bad input line: not work, reported apart."""
        return self.kind == BAD


def state_of(stored: str, version: int = SCHEMA_VERSION) -> State:
    """The state a ledger row of format ``version`` keeps (a file read only is not migrated)."""
    if version < STATES_KEPT:
        return RENAMED.get(stored) or State(stored)
    return State(stored)


# The write-ahead log is copied into the database (checkpointed) once it holds this many pages,
# and cut back to this size after, instead of the 1,000 pages (4 MiB) SQLite lets it reach
# and keeps: on a small disk the room is for images, not for the log of their rows.
WAL_PAGES = 64
WAL_BYTES = 256 * 1024


def private_database(path: Path) -> None:
    """Readies ``path`` for SQLite, which opens its files itself (following symbolic links):
    a link at the database or at its ``-wal``/``-shm`` is refused (:class:`StorageError`,
    exit 4); a new database is made 0600 here (``O_EXCL|O_NOFOLLOW``), and SQLite gives its
    log and shared memory the database's mode. A ledger holds what each line asked and got:
    other users of the machine have no business reading it."""

    for suffix in ("-wal", "-shm"):
        side = Path(f"{path}{suffix}")
        refuse_link(side)
        with contextlib.suppress(FileNotFoundError):  # left by a run before ledgers were private
            make_private(side)
    open_private(path)


def connect(path: Path, *, check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection to the ledger at ``path`` as a run writes it: WAL (readers never wait for
    the writer), a busy timeout, and a log cut back to :data:`WAL_BYTES` after checkpoints."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=check_same_thread)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=10000")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
        db.execute(f"PRAGMA journal_size_limit={WAL_BYTES}")
    except BaseException:
        db.close()
        raise
    return db


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Brings a ledger written by an earlier format forward (its rows kept, their states
    renamed), or refuses one written by a newer imggw; makes the schema where there is none."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StorageError(
            f"{path} was written by a newer imggw (ledger format {version}, this one "
            f"reads up to {SCHEMA_VERSION}): upgrade imggw to resume this run",
            code="ledger_too_new",
        )
    exists = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='lines'"
    ).fetchone()
    if exists and version < SCHEMA_VERSION:
        db.execute("BEGIN IMMEDIATE")
        have = {r[1] for r in db.execute("PRAGMA table_info(lines)")}
        if "fingerprint" in have:
            db.execute("ALTER TABLE lines RENAME COLUMN fingerprint TO digest")
        for name, kind in _ADDED.items():
            if name not in have:
                db.execute(f"ALTER TABLE lines ADD COLUMN {name} {kind}")
        if "request" in have:  # the first format kept the request under this name
            db.execute("UPDATE lines SET fields = request WHERE fields = '{}'")
        if version < STATES_KEPT:  # once: the rows' states become the core's
            cases = " ".join(f"WHEN '{old}' THEN '{new.value}'" for old, new in RENAMED.items())
            db.execute(f"UPDATE lines SET state = CASE state {cases} ELSE state END")
        db.execute("COMMIT")
    db.executescript(_SCHEMA)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
