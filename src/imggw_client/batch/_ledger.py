"""The batch ledger: one SQLite database (WAL) per run or shard, one row per input line.

Rows are read in line order, a chunk at a time, so a million-line run never holds them all;
counts and money are summed by SQLite once, then kept up to date as lines change state. Saves
go to one writer thread that commits them in groups (the keys need no sync of their own: they
follow from the run's identity), so the event loop never waits on the disk; a failing disk
becomes one :class:`StorageError` that says the same command resumes. A lock file (``filelock``:
released by the system even if its holder is killed, on Windows too) keeps a second process out.
"""

from __future__ import annotations

import contextlib
import json
import queue
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock

from .._exceptions import ImggwError, RequestValidationError
from .._files import StorageError, cannot, make_private, open_private, refuse_link
from ._input import GENERATE
from ._states import (
    DOWNLOADING,
    EXPIRED,
    FAILED,
    LEGACY,
    PENDING,
    RUNNING,
    SAVED,
    STATUS,
    LineState,
)

LEDGER_NAME = "ledger.sqlite"
LOCK_NAME = ".imggw-batch.lock"
# PRAGMA user_version: 0 or 1 the first format; 2 added kinds, fields, expiries; 3 renamed the
# states (see _states.LEGACY) and `fingerprint` to `digest`, and added when a task was
# submitted and first seen finished.
SCHEMA_VERSION = 3
INVALID_LINE = "invalid_line"  # a bad input line's error code
NOT_FOUND = "not_found"  # a line's task unknown to the gateway (see Ledger.recheck)
BAD = "bad"  # the kind of a bad input line's row (the others: _input.GENERATE, COLLECT)
STOPPED_BY = "stopped_by"  # the meta key of the guard that stopped the last run's submits
_LINKS_BLANKED = "links_blanked"  # the meta key of a ledger whose links keep no key

_COLUMNS = (
    "identity", "line", "caller_id", "kind", "digest", "fields", "surface", "idempotency_key",
    "task_id", "state", "urls", "expires_at", "error_code", "error_message", "files",
    "credits", "cost", "finished_at", "submitted_at", "completed_at",
)  # fmt: skip
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
    planned         INTEGER NOT NULL DEFAULT 0,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS lines_by_line ON lines (planned, line);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Columns that earlier formats lack, with how they are added.
_ADDED = {
    "kind": "TEXT NOT NULL DEFAULT 'generate'", "fields": "TEXT NOT NULL DEFAULT '{}'",
    "expires_at": "REAL", "finished_at": "REAL", "planned": "INTEGER NOT NULL DEFAULT 0",
    "submitted_at": "REAL", "completed_at": "REAL",
}  # fmt: skip


class BatchLockedError(ImggwError):
    """Another process is running a batch in this output folder.

    Example::

        except BatchLockedError:
            sys.exit("a batch is already running there")
    """


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
    final state; Unix seconds)."""

    identity: str
    line: int
    caller_id: str | None
    kind: str
    digest: str
    fields: dict[str, Any]
    surface: str
    idempotency_key: str | None
    task_id: str | None
    state: LineState
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

    def values(self) -> tuple[Any, ...]:
        return (
            self.identity, self.line, self.caller_id, self.kind, self.digest,
            json.dumps(self.fields, ensure_ascii=False), self.surface, self.idempotency_key,
            self.task_id, self.state.value, json.dumps(self.urls), self.expires_at,
            self.error_code, self.error_message, json.dumps(self.files), self.credits, self.cost,
            self.finished_at, self.submitted_at, self.completed_at,
        )  # fmt: skip

    @classmethod
    def from_values(cls, values: tuple[Any, ...]) -> Row:
        named = dict(zip(_COLUMNS, values, strict=True))
        for name in ("fields", "urls", "files"):
            named[name] = json.loads(named[name])
        named["state"] = state_of(named["state"])
        return cls(**named)

    @property
    def is_bad(self) -> bool:
        """A bad input line: not work, reported apart."""
        return self.kind == BAD


def state_of(stored: str) -> LineState:
    """The state a ledger row keeps, whatever format wrote it."""
    return LEGACY.get(stored) or LineState(stored)


@dataclass
class Totals:
    """Lines per state, and the money they cost, for one plan. ``cost_unknown`` counts the
    lines charged in credits whose gateway stated no cost (surface alpha): their cost is not
    zero, it is not known."""

    counts: Counter[LineState] = field(default_factory=Counter)
    credits: float = 0.0
    cost: float = 0.0
    cost_unknown: int = 0


# The write-ahead log is copied into the database (checkpointed) once it holds this many pages,
# and cut back to this size after, instead of the 1,000 pages (4 MiB) SQLite lets it reach
# and keeps: on a small disk the room is for images, not for the log of their rows.
WAL_PAGES = 64
WAL_BYTES = 256 * 1024


def _private_database(path: Path) -> None:
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


def _connect(path: Path, *, check_same_thread: bool = True) -> sqlite3.Connection:
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


class Ledger:
    """A run's (or shard's) ledger. Open it with :meth:`open`; rows change through
    :meth:`save`, which a writer thread commits in groups."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.created = not path.exists()  # made by this process: see discard()
        try:
            _private_database(path)
            self._db = _connect(path, check_same_thread=False)
            self._migrate()
            last = self._db.execute("SELECT value FROM meta WHERE key='plan'").fetchone()
        except (sqlite3.Error, OSError) as exc:
            if hasattr(self, "_db"):
                self._db.close()
            raise storage_error(path, exc) from exc
        self._plan = int(last[0]) if last else 0  # the last plan committed: what a reader sees
        self._read_lock = threading.Lock()
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._failure: StorageError | None = None

    @classmethod
    @contextlib.contextmanager
    def open(cls, folder: Path, *, prepare: Callable[[], None] | None = None) -> Iterator[Ledger]:
        """The ledger in ``folder``, locked for this process, closed (and flushed) on exit.
        ``prepare`` runs once the lock is held, before the database is opened (a shard puts
        its checkpoint back there)."""
        if folder.exists() and not folder.is_dir():  # the path is the mistake: a usage error
            raise RequestValidationError(
                "out_dir", f"cannot use {folder} as the output folder: a file is there"
            )
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except (NotADirectoryError, FileExistsError) as exc:  # a file on the way: the path
            raise RequestValidationError(
                "out_dir", f"cannot use {folder} as the output folder: {exc.strerror}"
            ) from exc
        except OSError as exc:  # a read-only or full disk: the place to write is the fault
            raise storage_error(folder, exc, "create") from exc

        refuse_link(folder / LOCK_NAME)
        lock = filelock.FileLock(str(folder / LOCK_NAME), blocking=False)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise BatchLockedError(
                f"another batch is running in {folder} (lock {LOCK_NAME}); wait for it to "
                "finish, or use another output folder",
                code="batch_locked",
            ) from None
        except OSError as exc:
            raise storage_error(folder / LOCK_NAME, exc) from exc
        try:
            if prepare is not None:
                prepare()
            ledger = cls(folder / LEDGER_NAME)
            try:
                yield ledger
            finally:
                ledger.close()
        finally:
            lock.release()

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"{self.path} was written by a newer imggw (ledger format {version}, this one "
                f"reads up to {SCHEMA_VERSION}): upgrade imggw to resume this run",
                code="ledger_too_new",
            )
        exists = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='lines'"
        ).fetchone()
        if exists and version < SCHEMA_VERSION:
            self._db.execute("BEGIN IMMEDIATE")
            have = {r[1] for r in self._db.execute("PRAGMA table_info(lines)")}
            if "fingerprint" in have:
                self._db.execute("ALTER TABLE lines RENAME COLUMN fingerprint TO digest")
            for name, kind in _ADDED.items():
                if name not in have:
                    self._db.execute(f"ALTER TABLE lines ADD COLUMN {name} {kind}")
            if "request" in have:  # the first format kept the request under this name
                self._db.execute("UPDATE lines SET fields = request WHERE fields = '{}'")
            for old, new in LEGACY.items():
                self._db.execute("UPDATE lines SET state=? WHERE state=?", (new.value, old))
            self._db.execute("COMMIT")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # ------------------------------------------------------------------------ planning

    def begin_plan(self) -> int:
        """Starts a plan (one pass over the input), in one transaction: it commits whole or
        not at all. Returns the plan's number."""
        self._plan += 1
        self._db.execute("BEGIN IMMEDIATE")
        return self._plan

    def plan_line(self, row: Row) -> tuple[Row, bool] | None:
        """Puts a line of the input into the plan: its row as it was if the line is known and
        unchanged, else a new row. Returns (row, new), or None if another line of this plan
        has the same identity."""
        found = self._db.execute(
            f"SELECT planned, {', '.join(_COLUMNS)} FROM lines WHERE identity=?", (row.identity,)
        ).fetchone()
        now = time.time()
        if found is not None and found[0] == self._plan:
            return None
        if found is not None:
            old = Row.from_values(found[1:])
            if old.digest == row.digest:
                old.line, old.fields = row.line, row.fields or old.fields
                self._db.execute(
                    "UPDATE lines SET line=?, fields=?, planned=? WHERE identity=?",
                    (old.line, json.dumps(old.fields, ensure_ascii=False), self._plan,
                     old.identity),
                )  # fmt: skip
                return old, False
        self._db.execute(
            f"INSERT OR REPLACE INTO lines ({', '.join(_COLUMNS)}, planned, created_at, "
            f"updated_at) VALUES ({', '.join('?' * (len(_COLUMNS) + 3))})",
            (*row.values(), self._plan, now, now),
        )
        return row, True

    def recheck(self) -> None:
        """Within a plan: the moves back of ``_states.RECHECKS``. Lines that failed for what a
        later look may find otherwise, at no cost (a task the gateway did not know; a task
        that succeeded but whose results could not be saved: links that died, a document
        served in place of an image; a submit answered 404, which made nothing), are looked at
        again by this run: a query and a download, or a submit with the line's own key."""
        clear = "error_code=NULL, error_message=NULL"
        self._db.execute(
            f"UPDATE lines SET state=?, {clear} WHERE planned=? AND task_id IS NOT NULL "
            "AND (state=? OR (state=? AND urls != '[]'))",
            (DOWNLOADING.value, self._plan, EXPIRED.value, FAILED.value),
        )
        self._db.execute(
            f"UPDATE lines SET state=?, {clear} WHERE planned=? AND state=? AND error_code=? "
            "AND task_id IS NOT NULL",
            (RUNNING.value, self._plan, FAILED.value, NOT_FOUND),
        )
        self._db.execute(
            f"UPDATE lines SET state=?, {clear} WHERE planned=? AND state=? AND error_code=? "
            "AND task_id IS NULL AND kind=?",
            (PENDING.value, self._plan, FAILED.value, NOT_FOUND, GENERATE),
        )

    def end_plan(self, *, commit: bool) -> None:
        if commit:
            self._db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('plan', ?)", (str(self._plan),)
            )
            self._db.execute("COMMIT")
            # A plan of many lines is one big transaction: its log is copied into the
            # database now, so that the next write starts the log again, cut to WAL_BYTES.
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        else:
            self._db.execute("ROLLBACK")
            self._plan -= 1

    def charges(self) -> dict[str, tuple[float | None, float | None]]:
        """The highest price (credits, cost) seen per resolution among the plan's lines: what
        the run's guards estimate a line at. As ``_guards.settles`` has it, a price is a
        positive charge, or the final one of a task that succeeded: the 0 a task states while
        it runs, or a failed task's, is none."""
        succeeded = [DOWNLOADING.value, SAVED.value, EXPIRED.value]
        succeeded += [old for old, new in LEGACY.items() if new in (DOWNLOADING, SAVED)]
        with self._read_lock:
            found = self._db.execute(
                "SELECT json_extract(fields, '$.resolution'), MAX(credits), MAX(cost) FROM lines "
                "WHERE planned=? AND (credits IS NOT NULL OR cost IS NOT NULL) AND ("
                f"state IN ({', '.join('?' * len(succeeded))}) "
                "OR ((credits IS NULL OR credits > 0) AND (cost IS NULL OR cost > 0))) GROUP BY 1",
                (self._plan, *succeeded),
            )
            return {str(res or ""): (credits, cost) for res, credits, cost in found}

    def waiting_by_resolution(self, state: LineState) -> dict[str, int]:
        """Generate lines in ``state`` per resolution (``pending``: what is left to submit;
        ``running``: what was sent and is not charged yet, with no charge stated)."""
        uncharged = " AND credits IS NULL AND cost IS NULL" if state is RUNNING else ""
        with self._read_lock:
            found = self._db.execute(
                "SELECT json_extract(fields, '$.resolution'), COUNT(*) FROM lines "
                f"WHERE planned=? AND kind=? AND state=?{uncharged} GROUP BY 1",
                (self._plan, GENERATE, state.value),
            )
            return {str(res or ""): n for res, n in found}

    def unsaved_by_resolution(self) -> dict[str, int]:
        """Lines whose results are still to be saved (``running``, ``downloading``) per
        resolution (``""``: not stated, as for a collected task): the room a run keeps free."""
        with self._read_lock:
            found = self._db.execute(
                "SELECT json_extract(fields, '$.resolution'), COUNT(*) FROM lines "
                "WHERE planned=? AND kind!=? AND state IN (?, ?) GROUP BY 1",
                (self._plan, BAD, RUNNING.value, DOWNLOADING.value),
            )
            return {str(res or ""): n for res, n in found}

    def durations(self, newest: int) -> dict[tuple[str, str], list[float]]:
        """How long the run's tasks took, from their submit's answer to being seen finished,
        per (surface, resolution): the ``newest`` of each kind, oldest first. What a resumed
        run's polls start from (DESIGN 15); collected tasks, whose start is not known, and
        replayed ones (no ``submitted_at``) are left out."""
        found: dict[tuple[str, str], list[float]] = {}
        with self._read_lock:
            for surface, resolution, took in self._db.execute(
                "SELECT surface, resolution, took FROM ("
                " SELECT surface, json_extract(fields, '$.resolution') AS resolution,"
                " completed_at - submitted_at AS took, ROW_NUMBER() OVER ("
                "  PARTITION BY surface, json_extract(fields, '$.resolution')"
                "  ORDER BY completed_at DESC) AS n"
                " FROM lines WHERE kind=? AND submitted_at IS NOT NULL"
                " AND completed_at IS NOT NULL)"
                " WHERE n <= ? ORDER BY surface, resolution, n DESC",
                (GENERATE, newest),
            ):
                found.setdefault((str(surface), str(resolution or "")), []).append(float(took))
        return found

    def kinds(self) -> Counter[tuple[str, LineState]]:
        """The plan's lines per (kind, state): what a dry run tells."""
        found: Counter[tuple[str, LineState]] = Counter()
        with self._read_lock:
            for kind, state, n in self._db.execute(
                "SELECT kind, state, COUNT(*) FROM lines WHERE planned=? GROUP BY 1, 2",
                (self._plan,),
            ):
                found[(str(kind), state_of(state))] += n
        return found

    def get_meta(self, key: str) -> str | None:
        """A value the run keeps beside its lines (``stopped_by``, say)."""
        with self._read_lock:
            found = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if found is None else str(found[0])

    def set_meta(self, key: str, value: str | None) -> None:
        """Keeps (or with None, forgets) a value beside the run's lines. Blocking."""
        with self._read_lock:
            try:
                if value is None:
                    self._db.execute("DELETE FROM meta WHERE key=?", (key,))
                else:
                    self._db.execute(
                        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value)
                    )
            except sqlite3.Error as exc:
                raise storage_error(self.path, exc) from exc

    def blank_links(self, secret: str, blank: str) -> int:
        """Replaces ``secret`` by ``blank`` in every link the ledger keeps, and wipes the old
        bytes (SQLite's secure delete, then a log truncated): ledgers written before links
        carrying the API key were kept blanked hold it in clear. A secret under 8 characters
        is left (it occurs in links by chance; the engine blanks it where it is a whole path
        segment or query value). Returns how many lines changed. Blocking."""
        if len(secret) < 8 or self.get_meta(_LINKS_BLANKED) is not None:
            return 0  # a ledger once looked through keeps its links blanked from then on
        with self._read_lock:
            try:
                found = self._db.execute(
                    "SELECT 1 FROM lines WHERE instr(urls, ?) > 0 LIMIT 1", (secret,)
                ).fetchone()
                self._db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, '1')", (_LINKS_BLANKED,)
                )
                if found is None:
                    return 0
                self._db.execute("PRAGMA secure_delete=ON")
                changed = self._db.execute(
                    "UPDATE lines SET urls=replace(urls, ?, ?) WHERE instr(urls, ?) > 0",
                    (secret, blank, secret),
                ).rowcount
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._db.execute("PRAGMA secure_delete=OFF")  # the rest costs no more I/O
            except sqlite3.Error as exc:
                raise storage_error(self.path, exc) from exc
        return int(changed)

    def last_surfaces(self) -> set[str]:
        """The surfaces the last plan's generate lines ran on (at most two are told apart):
        a run whose ``run.json`` predates keeping it is told by its ledger."""
        found = self._db.execute(
            "SELECT DISTINCT surface FROM lines WHERE planned=? AND kind=? LIMIT 2",
            (self._plan, GENERATE),
        )
        return {surface for (surface,) in found}

    # ------------------------------------------------------------------------ reading

    def totals(self) -> Totals:
        """Lines per state and their money, bad input lines left out (they are not work)."""
        totals = Totals()
        with self._read_lock:
            for state, n, credits, cost, unknown in self._db.execute(
                # A charge below 0 (kept by versions that did not clamp it) counts as 0.
                "SELECT state, COUNT(*), TOTAL(MAX(credits, 0)), TOTAL(MAX(cost, 0)), "
                "SUM(credits IS NOT NULL AND cost IS NULL) FROM lines "
                "WHERE planned=? AND kind!=? GROUP BY state",
                (self._plan, BAD),
            ):
                totals.counts[state_of(state)] += n
                totals.credits += credits
                totals.cost += cost
                totals.cost_unknown += unknown or 0
        return totals

    def rows(
        self, *, after: int = 0, limit: int = 1000, states: tuple[LineState, ...] = ()
    ) -> list[Row]:
        """The plan's rows in line order, past line ``after``: one chunk of a stream."""
        where = "planned=? AND line>?"
        args: list[Any] = [self._plan, after]
        if states:
            where += f" AND state IN ({', '.join('?' * len(states))})"
            args += [state.value for state in states]
        try:
            with self._read_lock:
                cursor = self._db.execute(
                    f"SELECT {', '.join(_COLUMNS)} FROM lines WHERE {where} ORDER BY line LIMIT ?",
                    (*args, limit),
                )
                return [Row.from_values(values) for values in cursor.fetchall()]
        except sqlite3.Error as exc:
            raise storage_error(self.path, exc) from exc

    def next_rows(self, after: int) -> list[Row]:
        """The next chunk of the plan's rows past line ``after`` (for a streaming reader)."""
        return self.rows(after=after, limit=500)

    def iter_rows(self, states: tuple[LineState, ...] = (), chunk: int = 1000) -> Iterator[Row]:
        """Every row of the plan in line order, read a chunk at a time."""
        after = 0
        while batch := self.rows(after=after, limit=chunk, states=states):
            yield from batch
            after = batch[-1].line

    # ------------------------------------------------------------------------ writing

    def save(self, row: Row) -> None:
        """Queues the row's new state for the writer thread; raises the writer's failure."""
        if self._failure is not None:
            raise self._failure
        if self._writer is None:
            self._writer = threading.Thread(target=self._write, name="imggw-ledger", daemon=True)
            self._writer.start()
        self._queue.put((*row.values(), time.time(), row.identity))

    def save_now(self, row: Row) -> None:
        """Writes one row at once, in the caller's thread (outside a run's event loop)."""
        try:
            self._update([(*row.values(), time.time(), row.identity)])
        except sqlite3.Error as exc:
            raise storage_error(self.path, exc) from exc

    def flush(self) -> None:
        """Waits until every queued save is committed; raises the writer's failure."""
        if self._writer is not None:
            self._queue.join()
        if self._failure is not None:
            raise self._failure

    def _update(self, values: list[tuple[Any, ...]]) -> None:
        assignments = ", ".join(f"{name}=?" for name in _COLUMNS)
        with self._read_lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    f"UPDATE lines SET {assignments}, updated_at=? WHERE identity=?", values
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            # Group commit: whatever queued up while the last commit ran goes in this one.
            while len(batch) < 5000:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            values = [v for v in batch if v is not None]
            try:
                if values and self._failure is None:
                    self._update(values)
            except sqlite3.Error as exc:
                self._failure = storage_error(self.path, exc)
            finally:
                for _ in batch:
                    self._queue.task_done()
            if None in batch:
                return

    def close(self) -> None:
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join()
            self._writer = None
        with contextlib.suppress(sqlite3.Error):
            self._db.close()

    def discard(self) -> None:
        """Closes the ledger and deletes it, if this process made it: a plan that was refused
        leaves no ledger behind in a folder that had none."""
        self.close()
        if self.created:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)


def remove_if_empty(folder: Path) -> None:
    """Removes a folder a refused run (or a dry run) made, if it holds nothing but the lock."""
    with contextlib.suppress(OSError):  # never made, or not empty (it lists the bad lines)
        (folder / LOCK_NAME).unlink(missing_ok=True)
        folder.rmdir()


# ---------------------------------------------------------------------------- reading one


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[tuple[sqlite3.Connection, int] | None]:
    """A ledger file opened read only (a live run, another process, may be writing it), and
    its last plan; None when it holds no plan (or is no ledger). A symbolic link planted in
    its place is refused, not read."""

    refuse_link(path)
    try:
        # A reader left half-read (a merge that stopped early) is closed when the garbage
        # collector finds it, in whatever thread runs then: a read-only connection may be.
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0,
                             check_same_thread=False)  # fmt: skip
    except sqlite3.Error:
        yield None
        return
    with contextlib.closing(db):
        try:
            found = db.execute("SELECT value FROM meta WHERE key='plan'").fetchone()
        except sqlite3.Error:
            found = None
        yield (db, int(found[0])) if found is not None else None


def read_rows(path: Path) -> Iterator[Row]:
    """Every row of a ledger file's last plan, in line order, read only: what ``status`` and
    ``merge`` read of a shard's ledger or checkpoint. Whatever cannot be read ends the rows."""
    with _read_only(path) as opened:
        if opened is None:
            return
        db, plan = opened
        try:
            cursor = db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM lines WHERE planned=? ORDER BY line", (plan,)
            )
            for values in cursor:
                yield Row.from_values(values)
        except sqlite3.Error:
            return


def count_statuses(path: Path) -> dict[str, int] | None:
    """Lines per word of ``_states.STATUSES`` in a ledger file's last plan (bad input lines
    as ``bad``), read only and summed by SQLite: cheap enough to read every few seconds while
    a shard runs. None when the file holds no plan yet."""
    with _read_only(path) as opened:
        if opened is None:
            return None
        db, plan = opened
        found: Counter[str] = Counter()
        for bad, state, n in db.execute(
            "SELECT kind=?, state, COUNT(*) FROM lines WHERE planned=? GROUP BY 1, 2",
            (BAD, plan),
        ):
            found["bad" if bad else STATUS[state_of(state)]] += n
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
            _private_database(copy)
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
