"""The journal: one SQLite file that keeps every paid task a client submits, from before its
request leaves until its results are saved (DESIGN 19, 22).

Several processes (and threads) may share one file: WAL, a busy timeout, a short transaction
per event. A row is committed before its submit is sent, so a process killed at any moment
leaves every task it may have paid for on disk, with the idempotency key that finds it again.
The state a row moves to is decided by the one table in ``_core/states.py``; a status seen
again that would change nothing this process wrote is not written at all. A row a live process
works on is leased to it (``_lease``): a sibling's recovery leaves it alone.

An event loop writes through :meth:`Journal.try_record`, on its own thread, with a connection
that never waits for a lock (busy timeout 0) and never checkpoints: a commit costs the write
alone (``synchronous=NORMAL`` in WAL syncs only at checkpoints). When the file is busy, and for
the first write and every ``CHECKPOINT_EVERY``-th, it hands the event to :meth:`Journal.record`
in a worker thread, which waits for the lock and checkpoints (and restarts the WAL, which syncs
its header) off the loop. An ``AsyncClient`` opens its journal there too, on first use.

A batch output folder's ledger is a file of the same format (``schema``): ``Journal(folder)``
opens it read only to list its run's tasks, and refuses to write them (the run does, and
resumes them).

No result link is stored (one may carry a key): the task is asked for again when its results
are downloaded. The file is made 0600 in a folder made 0700, and a journal another user could
write is refused (``_private``). A row that cannot be read is skipped and reported (``_rows``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from .._core import states
from .._core.exceptions import ConfigurationError, ImggwError
from .._core.states import State
from .._files import StorageError, open_private, refuse_link
from . import rows as _rows
from . import schema as _schema
from .lease import Leases
from .moves import Memo, apply, event_of, named, seen_values
from .private import ready_folder, refuse_unsafe_files
from .rows import DamagedRow, JournalEntry
from .schema import FINAL, NEWEST_FIRST, OPEN, Scope

__all__ = ["DamagedRow", "Journal", "JournalEntry", "Scope"]

log = logging.getLogger("imggw_client")

BUSY_TIMEOUT_MS = 30_000  # many CLI processes at once wait for each other, never "locked"
# Writes between two checkpoints, made off the event loop (a checkpoint syncs the file): about
# 500 pages of WAL at 4 pages a write, half SQLite's own 1,000-page autocheckpoint.
CHECKPOINT_EVERY = 128
MEMO_SIZE = 4096  # tasks whose last written row this process remembers (see Journal._needless)
WARNED_SIZE = 4096  # rows and tasks this journal warned about, at most, before it forgets some
PRUNE_AFTER = 30 * 86400.0  # final rows older than this go (Journal.prune's default)


class Journal:
    """A journal of paid tasks in one SQLite file (see the module's docstring). Pass it (or a
    path) as ``Client(journal=...)``; ``IMGGW_JOURNAL`` names one for every client. A path that
    cannot be opened raises :class:`ConfigurationError` (code ``journal_unusable``) before
    anything is sent; one another user could write (a folder or file writable by group or
    others, owned by someone else, or reached through a symbolic link) code ``journal_unsafe``.

    A batch output folder (or its ``ledger.sqlite``) opens as the journal of its run's tasks,
    to list them (:meth:`tasks`, :meth:`count`); it is written by its run alone, so a write
    (a submit, :meth:`prune`, a collect) raises :class:`ConfigurationError`
    (``journal_unusable``) and sends nothing.

    Example::

        journal = Journal("~/.local/state/my-app/imggw.sqlite")
        with Client(journal=journal) as client:
            for sub in client.unfinished():       # what a killed process left
                ...
        print([e.task_id for e in journal.tasks(limit=50)])
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._prepare(path)
        with self._connection(writing=False):  # opened now: a path that cannot be used says so
            pass

    @classmethod
    def _deferred(cls, path: str | os.PathLike[str]) -> Journal:
        """A journal opened on first use (an ``AsyncClient``'s: in a worker thread, never on
        its event loop)."""
        journal = cls.__new__(cls)
        journal._prepare(path)
        return journal

    def _prepare(self, path: str | os.PathLike[str]) -> None:
        # Absolute now: a child forked after a chdir reopens the same file, not a new one.
        self.path = Path(os.path.expanduser(os.fspath(path))).absolute()
        # A batch folder's ledger: read here, written by its run alone (known once opened).
        self._ledger = self.path.is_dir()
        if self._ledger:
            self.path /= _schema.LEDGER_NAME
        self._lock = threading.Lock()  # _db's; taken before _loop_lock when both are
        self._db: sqlite3.Connection | None = None
        self._loop_lock = threading.Lock()  # _nowait's, which try_record never waits for
        self._nowait: sqlite3.Connection | None = None  # the event loop's: busy timeout 0
        self._pid = os.getpid()
        self._closed = False
        # Writes since the last checkpoint; _due: a try_record handed the next one to record;
        # _ready: this process has checkpointed once (the WAL's start syncs, off the loop).
        self._writes, self._due, self._ready = 0, False, False
        # (gateway, key_fp, surface, task_id) -> (state, expires_at, charge) last committed here
        self._memo: dict[tuple[str, str, str, str], tuple[State, Any, Any]] = {}
        self._memo_lock = threading.Lock()
        self._warned: dict[object, None] = {}  # damaged rows and unrecorded tasks told of
        self._leases = Leases(self.path, OPEN)
        # A journal dropped unclosed (a client made per request with journal=<path>, never
        # closed) stops renewing as a closed one does: its renewer thread, and that thread's
        # own connection to the file, would otherwise live as long as the process, one per
        # journal. The renewer holds the leases, never the journal.
        weakref.finalize(self, self._leases.stop)
        _JOURNALS.add(self)

    def _after_fork(self) -> None:
        """In a forked child: the locks anew. A thread of the parent that held one as it forked
        is not in the child to let it go (the handles are opened anew on first use)."""
        self._lock, self._loop_lock, self._memo_lock = (threading.Lock() for _ in range(3))
        self._leases.forked()

    # ------------------------------------------------------------------------ reading

    def tasks(
        self,
        *,
        unfinished: bool = False,
        scope: Scope | None = None,
        limit: int | None = None,
        states: Collection[str] | None = None,
    ) -> list[JournalEntry]:
        """Journaled tasks, newest first; ``unfinished``: only those that still need a resend,
        a wait or a download; ``scope``: only one gateway's and key's; ``states``: only those
        in these states (``"unknown"``, ``"pending"``, ``"running"``, ``"succeeded"``,
        ``"saved"``, ``"failed"``, ``"expired"``, ``"not_found"``); ``limit``: the newest this
        many at most. A row that cannot be read is skipped (one WARNING names its key; see
        :meth:`damaged`).

        Example::

            for entry in journal.tasks(unfinished=True, limit=50):
                print(entry.task_id or "(outcome unknown)", entry.status)
        """
        found: list[JournalEntry] = []
        with self._reading() as db:
            clause, args = self._where(unfinished, scope, states, limit=limit)
            sql = f"SELECT {_rows.COLUMNS} FROM tasks{clause}{NEWEST_FIRST}"
            if limit is None:
                return self._entries(db.execute(sql, args).fetchall())
            offset = 0
            while len(found) < limit:  # more only when damaged rows were skipped
                want = limit - len(found)
                rows = db.execute(f"{sql} LIMIT ? OFFSET ?", (*args, want, offset)).fetchall()
                found += self._entries(rows)
                offset += len(rows)
                if len(rows) < want:
                    break
        return found

    def count(
        self,
        *,
        unfinished: bool = False,
        scope: Scope | None = None,
        states: Collection[str] | None = None,
    ) -> int:
        """How many tasks :meth:`tasks` would list with the same filters and no limit (a
        damaged row counts where its stored state and scope match).

        Example::

            print(journal.count(unfinished=True), "tasks still need something")
        """
        with self._reading() as db:
            clause, args = self._where(unfinished, scope, states)
            total: int = db.execute(f"SELECT COUNT(*) FROM tasks{clause}", args).fetchone()[0]
        return total

    def damaged(self, scope: Scope | None = None) -> list[DamagedRow]:
        """The rows that cannot be read (an unknown state or surface, files that are not a
        list of paths, an absurd time, bytes that are not text), newest first; ``scope``:
        only one gateway's and key's. :meth:`tasks` skips them; nothing else is held up.

        Example::

            for bad in journal.damaged():
                print(f"row {bad.row} ({bad.idempotency_key}): {bad.reason}")
        """
        bad: list[DamagedRow] = []
        with self._reading() as db:
            clause, args = self._where(False, scope, None)
            for values in db.execute(
                f"SELECT {_rows.COLUMNS} FROM tasks{clause}{NEWEST_FIRST}", args
            ):
                try:
                    _rows.entry_of(values, self._base)
                except _rows.RowDamaged as why:
                    bad.append(_rows.damaged_row(values, why.reason))
        return bad

    def mark_saved(
        self, task_id: str, surface: str, files: Sequence[str | os.PathLike[str]], *, scope: Scope
    ) -> None:
        """Records that a task's results were saved where the SDK did not save them (read
        into memory, uploaded): the task is then no longer unfinished. ``files`` are kept as
        given (``s3://bucket/a.png`` stays so).

        Example::

            journal.mark_saved(task.id, task.surface, ["s3://bucket/a.png"],
                               scope=client.journal_scope)
        """
        given = tuple(os.fspath(f) for f in files)
        self.record(states.Saved(task_id, surface, given), scope)

    def prune(self, *, older_than: float = PRUNE_AFTER, scope: Scope | None = None) -> int:
        """Removes final rows (saved, failed, expired, not found) whose last change is older
        than ``older_than`` seconds (30 days by default); ``scope``: only one gateway's and
        key's. Rows that still need something are never removed. Returns how many went.

        Example::

            removed = journal.prune(older_than=7 * 86400)
        """
        clause, args = _schema.where(False, scope, FINAL)
        before = time.time() - _schema.seconds("older_than", older_than)
        try:
            with self._connection() as db:
                gone = db.execute(
                    f"DELETE FROM tasks{clause} AND COALESCE(changed, submitted_at, created) < ?",
                    (*args, before),
                ).rowcount
        except sqlite3.Error as exc:
            raise _failed(self.path, exc, "write") from exc
        return gone

    # ------------------------------------------------------------------------ writing

    def record(self, event: object, scope: Scope) -> None:
        """Commits one event of a flow's (``_core/states.py``); the table decides the move.
        Waits while another writer holds the file (30 s at most). Raises
        :class:`StorageError` if the file cannot be written: a submit is then not sent; an
        :class:`IdempotencyConflictError` when a submit would reuse a journaled key for
        another request. Example: ``journal.record(event, client.journal_scope)``, as a
        blocking driver does.
        """
        if self._needless(event, scope):
            return
        try:
            with self._connection() as db:
                if self._due or not self._ready or self._writes >= CHECKPOINT_EVERY:
                    # No write on the loop's connection meanwhile: the checkpoint syncs, and
                    # the write just after it restarts the WAL (a sync of its header) here.
                    with self._loop_lock:
                        with suppress(sqlite3.Error):  # not needed for this write
                            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                        self._writes, self._due, self._ready = 0, False, True
                        self._write(db, event, scope)
                else:
                    self._write(db, event, scope)
        except sqlite3.Error as exc:
            raise _failed(
                self.path, exc, "write", sending=isinstance(event, states.Sending)
            ) from exc

    def try_record(self, event: object, scope: Scope) -> bool:
        """Commits one event as :meth:`record` does, if that takes no waiting: True when it is
        committed (or needs no write); False when nothing was written and the caller should
        call :meth:`record` in a worker thread: another writer holds the file, a checkpoint is
        due or under way, another thread is in here, the file is not open yet, or the write
        failed (``record`` says why). What an event loop calls, on its own thread. Example::

            if not journal.try_record(event, scope):
                await anyio.to_thread.run_sync(journal.record, event, scope)
        """
        if self._needless(event, scope):
            return True
        if not self._loop_lock.acquire(blocking=False):  # record() is checkpointing
            return False
        try:
            if self._db is None or self._pid != os.getpid() or not self._ready:
                return False
            if self._writes >= CHECKPOINT_EVERY:  # this caller's record() makes it; the
                self._writes, self._due = 0, True  # loop's other writes go on meanwhile
                return False
            if self._nowait is None:
                self._nowait = self._open_nowait()
            self._write(self._nowait, event, scope)
            return True
        except sqlite3.Error:  # busy: another writer holds the lock (or a failure record reports)
            return False
        finally:
            self._loop_lock.release()

    def unrecorded(self, event: object, err: ImggwError) -> bool:
        """A write that failed (``err``) after its submit's request left: False for one before
        (the submit's own row: nothing may be sent without it; the caller raises ``err``).
        Else the answer the call got stands: one WARNING per task names what was not
        recorded (the row stays as it was, and a later collect replays its key), and True."""
        if isinstance(event, states.Sending):
            return False
        what = named(event)
        if self._warn_once(("unrecorded", what)):
            log.warning(
                "the journal %s did not record %s (%s); the call's answer stands, and "
                "the row keeps its key for a later collect",
                self.path,
                what,
                err.code or type(err).__name__,
            )
        return True

    def close(self) -> None:
        """Closes the file (a journal the client opened from a path is closed with it)."""
        with self._lock, self._loop_lock:
            self._closed = True
            self._leases.stop()
            if self._pid == os.getpid():
                for db in (self._nowait, self._db):
                    if db is not None:
                        db.close()
            self._db = self._nowait = None

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"

    # ------------------------------------------------------------------------ leases

    def _claim(self, scope: Scope) -> tuple[list[JournalEntry], int]:
        """This scope's unfinished tasks that no other live process holds, oldest first; this
        process holds them from now on (a lease renewed while it lives). Damaged rows are
        skipped and reported. And how many of the scope's unfinished tasks others hold."""
        now = time.time()
        owner, until = self._leases.owner, self._leases.until(now)
        marks = ",".join("?" * len(OPEN))
        sql = (
            f"SELECT {_rows.COLUMNS}, lease_owner, lease_until FROM tasks WHERE gateway = ? AND "
            f"key_fp = ? AND state IN ({marks}) ORDER BY row"
        )
        try:
            with self._connection() as db, _schema.transaction(db):
                rows = db.execute(sql, (scope.gateway, scope.key_fingerprint, *OPEN)).fetchall()
                free = [r[:-2] for r in rows if self._leases.free(r[-2], r[-1], now)]
                readable = {values[0]: entry for values, entry in self._read(free)}
                db.executemany(
                    "UPDATE tasks SET lease_owner = ?, lease_until = ? WHERE row = ?",
                    [(owner, until, row) for row in readable],
                )
        except sqlite3.Error as exc:
            raise _failed(self.path, exc, "read") from exc
        if readable:
            self._leases.taken()
        return list(readable.values()), len(rows) - len(free)

    # ------------------------------------------------------------------------ internals

    def _where(
        self,
        unfinished: bool,
        scope: Scope | None,
        wanted: Collection[str] | None,
        *,
        limit: object = None,
    ) -> tuple[str, list[Any]]:
        """A listing's WHERE clause in this file (a ledger's lists its rows that are tasks)."""
        return _schema.where(unfinished, scope, wanted, limit=limit, ledger=self._ledger)

    @property
    def _base(self) -> Path | None:
        """Where a ledger's file names are (its run's folder); None in a journal, whose are
        paths."""
        return _schema.results_folder(self.path) if self._ledger else None

    def _entries(self, rows: Sequence[Sequence[Any]]) -> list[JournalEntry]:
        """The entries of ``rows``; a damaged one is skipped, with one WARNING per row."""
        return [entry for _, entry in self._read(rows)]

    def _read(self, rows: Sequence[Sequence[Any]]) -> Iterator[tuple[Sequence[Any], JournalEntry]]:
        """Each readable row with its entry; a damaged one is skipped, with one WARNING."""
        base = self._base
        for values in rows:
            try:
                entry = _rows.entry_of(values, base)
            except _rows.RowDamaged as why:
                if self._warn_once(("row", values[0])):
                    log.warning(
                        "the journal %s has a row that cannot be read (row %s, "
                        "idempotency key %s: %s); skipped",
                        self.path,
                        values[0],
                        _rows.shown_key(values[2]),
                        why.reason,
                    )
                continue
            yield values, entry

    def _warn_once(self, about: object) -> bool:
        """Whether nothing was said of ``about`` yet (it is remembered as said)."""
        with self._memo_lock:
            if about in self._warned:
                return False
            if len(self._warned) >= WARNED_SIZE:
                self._warned.pop(next(iter(self._warned)))
            self._warned[about] = None
        return True

    def _open(self) -> sqlite3.Connection:
        if self._ledger:
            return self._open_ledger()
        ready_folder(self.path.parent)
        refuse_unsafe_files(self.path)
        open_private(self.path)
        db = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        db.text_factory = _rows.decoded
        try:
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            _schema.refuse_newer(db)  # before WAL mode changes the file
            if _schema.is_ledger(db):  # a ledger named by its file: read as its folder is
                db.close()
                self._ledger = True
                return self._open_ledger()
            db.execute("PRAGMA journal_mode=WAL")
            # A killed process loses nothing committed; a power cut may lose the last moment.
            db.execute("PRAGMA synchronous=NORMAL")
            _schema.migrate(db)
            refuse_unsafe_files(self.path)  # SQLite's side files, now that they exist
        except BaseException:
            db.close()
            raise
        return db

    def _open_ledger(self) -> sqlite3.Connection:
        """A batch folder's ledger, read only: its run writes it, and brings a ledger of an
        earlier format forward under the folder's lock (a listing changes nothing, not even
        that). Only a planted link is refused here: the folder is the run's, not a journal's
        that collects would pay from."""
        refuse_link(self.path.parent)
        refuse_link(self.path)
        if not self.path.is_file():
            shards = _schema.ledger_folders(self.path.parent)
            if shards:  # each shard keeps its own tasks
                why = (
                    f"a sharded run's folder: each shard's tasks are in its own folder, from "
                    f"{shards[0]} to {shards[-1].name}; open each of those "
                    "(batch.ledger_folders lists them; imggw tasks --folder lists them all)"
                )
                raise FileNotFoundError(2, why, str(self.path))
            raise FileNotFoundError(2, "a folder with no batch ledger in it", str(self.path))
        db = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro",
            uri=True,
            timeout=BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        db.text_factory = _rows.decoded
        try:
            version = _schema.refuse_newer(db)
            if not _schema.is_ledger(db):
                raise FileNotFoundError(2, "a folder with no batch ledger in it", str(self.path))
            if version < _schema.FORMAT:
                raise sqlite3.DatabaseError(
                    "a ledger of an earlier imggw: the batch command that made it brings it "
                    "forward when run again (nothing is sent twice); imggw batch status reads "
                    "it meanwhile"
                )
        except BaseException:
            db.close()
            raise
        return db

    def _open_nowait(self) -> sqlite3.Connection:
        """The event loop's connection (see the module's docstring): no I/O until it writes."""
        db = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
        db.text_factory = _rows.decoded
        for pragma in ("busy_timeout=0", "wal_autocheckpoint=0", "synchronous=NORMAL"):
            db.execute(f"PRAGMA {pragma}")  # synchronous as _open's: it is per connection
        return db

    def _write(self, db: sqlite3.Connection, event: object, scope: Scope) -> None:
        """One event in one transaction on ``db`` (its lock held), and its row in the memo."""
        with _schema.transaction(db):
            lease = (self._leases.owner, self._leases.until(time.time()))
            after = apply(db, event, scope, lease, self.path)
        self._writes += 1
        if isinstance(event, states.Sending):
            self._leases.taken()
        if after is not None:
            self._remember(after)

    def _needless(self, event: object, scope: Scope) -> bool:
        """Whether ``event`` would leave its row as this process last wrote it: a status the
        table keeps (``running`` again, ``succeeded`` after ``saved``) and no new link expiry
        or charge. Read without the lock: a row is at or past what the memo says, and an event
        the table ignores at one state it ignores at every later one."""
        if not isinstance(event, states.Seen) or self._db is None:  # closed: record() says so
            return False
        task = event.task
        known = self._memo.get((scope.gateway, scope.key_fingerprint, task.surface, task.id))
        if known is None:
            return False
        state, expires, charge = known
        if states.move(state, event_of(event)) is not state:
            return False
        new_expires, new_charge = seen_values(task)
        return new_expires in (None, expires) and new_charge in (None, charge)

    def _remember(self, after: Memo) -> None:
        key, state, expires, charge = after
        with self._memo_lock:  # two threads may write at once, on the two connections
            self._memo.pop(key, None)
            if state is None:
                return
            if len(self._memo) >= MEMO_SIZE:
                self._memo.pop(next(iter(self._memo)))  # the oldest written
            self._memo[key] = (state, expires, charge)

    @contextmanager
    def _connection(self, *, writing: bool = True) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                closed = f"the journal {self.path} is closed"
                raise ConfigurationError(closed, code="journal_unusable")
            if self._db is None or self._pid != os.getpid():
                # First use, or a forked child: the parent's handles are not ours.
                with self._loop_lock:
                    self._db, self._nowait, self._ready, self._due = None, None, False, False
                    self._pid = os.getpid()
                try:
                    self._db = self._open()
                except (OSError, sqlite3.Error, StorageError) as exc:
                    raise unusable(self.path, exc) from exc
            if writing and self._ledger:
                raise ConfigurationError(
                    f"the journal {self.path} is a batch folder's ledger: its run writes it "
                    "(the same batch command resumes it); it can be listed, not written. "
                    "Nothing was sent; give a journal of its own to write",
                    code="journal_unusable",
                )
            yield self._db

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection for a read; a file that cannot be read is a :class:`StorageError`."""
        try:
            with self._connection(writing=False) as db:
                yield db
        except sqlite3.Error as exc:
            raise _failed(self.path, exc, "read") from exc


_JOURNALS: weakref.WeakSet[Journal] = weakref.WeakSet()  # every journal of this process


def _forked() -> None:
    for journal in list(_JOURNALS):
        journal._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forked)


def unusable(path: Path, exc: BaseException) -> ConfigurationError:
    why = getattr(exc, "strerror", None) or getattr(exc, "message", None) or str(exc)
    return ConfigurationError(f"cannot use the journal {path} ({why})", code="journal_unusable")


def _failed(path: Path, exc: BaseException, verb: str, *, sending: bool = False) -> StorageError:
    """A read or write of the journal that failed; "nothing was sent" only for a submit's
    own row, the one write before its request leaves."""
    after = "; nothing was sent" if sending else ""
    return StorageError(f"cannot {verb} the journal {path} ({exc}){after}", code="journal_failed")
