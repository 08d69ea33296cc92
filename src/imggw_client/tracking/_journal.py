"""The journal: one SQLite file that keeps every paid task a client submits, from before its
request leaves until its results are saved (DESIGN 19).

Several processes (and threads) may share one file: WAL, a busy timeout, a short transaction
per event. A row is committed before its submit is sent, so a process killed at any moment
leaves every task it may have paid for on disk, with the idempotency key that finds it again.
The state a row moves to is decided by the one table in ``_core/states.py``; a status seen
again that would change nothing this process wrote is not written at all.

An event loop writes through :meth:`Journal.try_record`, on its own thread, with a connection
that never waits for a lock (busy timeout 0) and never checkpoints: a commit costs the write
alone (``synchronous=NORMAL`` in WAL syncs only at checkpoints). When the file is busy, and for
the first write and every ``CHECKPOINT_EVERY``-th, it hands the event to :meth:`Journal.record`
in a worker thread, which waits for the lock and checkpoints (and restarts the WAL, which syncs
its header) off the loop.

No result link is stored (one may carry a key): the task is asked for again when its results
are downloaded. The file is made 0600 in a folder made 0700.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._core import states
from .._core.exceptions import ConfigurationError
from .._core.models import ImageRequest, Task, TaskStatus
from .._core.states import State, Work
from .._files import StorageError, open_private

__all__ = ["Journal", "JournalEntry", "Scope"]

FORMAT = 1
BUSY_TIMEOUT_MS = 30_000  # many CLI processes at once wait for each other, never "locked"
# Writes between two checkpoints, made off the event loop (a checkpoint syncs the file): about
# 500 pages of WAL at 4 pages a write, half SQLite's own 1,000-page autocheckpoint.
CHECKPOINT_EVERY = 128
MEMO_SIZE = 4096  # tasks whose last written row this process remembers (see Journal._needless)

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
    UNIQUE (gateway, key_fp, surface, idempotency_key)
);
CREATE INDEX IF NOT EXISTS tasks_by_id ON tasks (gateway, key_fp, surface, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (gateway, key_fp, state);
"""
_COLUMNS = ("surface, idempotency_key, task_id, state, prompt, aspect_ratio, resolution, "
            "created, submitted_at, expires_at, charge, files, gateway")  # fmt: skip


@dataclass(frozen=True)
class Scope:
    """Whose tasks: one gateway and one API key (by its slow fingerprint, never the key)."""

    gateway: str
    key_fingerprint: str


@dataclass(frozen=True)
class JournalEntry:
    """One journaled task.

    ``task_id`` is None while the submit's outcome is unknown; ``status`` is the task's
    :class:`TaskStatus` value (``"succeeded"`` for a saved or expired one too), or
    ``"unknown"``; ``state`` says more (``saved``, ``expired``). Times are UTC datetimes (or
    None); ``files`` the paths its results were saved to; ``request`` what was asked.

    Example::

        for entry in journal.tasks(unfinished=True):
            print(entry.task_id, entry.status, entry.expires_at)
    """

    task_id: str | None
    surface: str
    idempotency_key: str
    status: str
    submitted_at: datetime | None
    expires_at: datetime | None
    files: tuple[Path, ...]
    request: ImageRequest
    state: str = State.UNKNOWN.value
    charge: float | None = None
    gateway: str = ""
    created_at: datetime | None = field(default=None, repr=False)

    @property
    def unfinished(self) -> bool:
        """Whether the task still needs something: a resend, a wait or a download."""
        return states.WORK.get(State(self.state)) is not None

    def as_json(self) -> dict[str, Any]:
        """The entry as plain JSON values (``imggw tasks --json`` prints one per line)."""
        return {
            "task_id": self.task_id,
            "surface": self.surface,
            "idempotency_key": self.idempotency_key,
            "status": self.status,
            "state": self.state,
            "submitted_at": _iso(self.submitted_at),
            "expires_at": _iso(self.expires_at),
            "files": [str(path) for path in self.files],
            "request": {
                "prompt": self.request.prompt,
                "aspect_ratio": self.request.aspect_ratio,
                "resolution": self.request.resolution,
            },
            "charge": self.charge,
            "gateway": self.gateway,
        }


class Journal:
    """A journal of paid tasks in one SQLite file (see the module's docstring). Pass it (or a
    path) as ``Client(journal=...)``; ``IMGGW_JOURNAL`` names one for every client. A path that
    cannot be opened raises :class:`ConfigurationError` (code ``journal_unusable``) before
    anything is sent.

    Example::

        journal = Journal("~/.local/state/my-app/imggw.sqlite")
        with Client(journal=journal) as client:
            for sub in client.unfinished():       # what a killed process left
                ...
        print([e.task_id for e in journal.tasks()])
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(os.path.expanduser(os.fspath(path)))
        self._lock = threading.Lock()  # _db's; taken before _loop_lock when both are
        self._db: sqlite3.Connection | None = None
        self._loop_lock = threading.Lock()  # _nowait's, which try_record never waits for
        self._nowait: sqlite3.Connection | None = None  # the event loop's: busy timeout 0
        self._pid = os.getpid()
        # Writes since the last checkpoint; _due: a try_record handed the next one to record;
        # _ready: this process has checkpointed once (the WAL's start syncs, off the loop).
        self._writes, self._due, self._ready = 0, False, False
        # (gateway, key_fp, surface, task_id) -> (state, expires_at, charge) last committed here
        self._memo: dict[tuple[str, str, str, str], tuple[State, Any, Any]] = {}
        self._memo_lock = threading.Lock()
        try:
            self._db = self._open()
        except (OSError, sqlite3.Error, StorageError) as exc:
            raise unusable(self.path, exc) from exc

    # ------------------------------------------------------------------------ reading

    def tasks(self, *, unfinished: bool = False, scope: Scope | None = None) -> list[JournalEntry]:
        """Every journaled task, newest first; ``unfinished``: only those that still need a
        resend, a wait or a download; ``scope``: only one gateway's and key's.

        Example::

            for entry in journal.tasks(unfinished=True):
                print(entry.task_id or "(outcome unknown)", entry.status)
        """
        where, args = [], []
        if unfinished:
            open_states = [s.value for s, work in states.WORK.items() if work is not None]
            where.append(f"state IN ({','.join('?' * len(open_states))})")
            args.extend(open_states)
        if scope is not None:
            where += ["gateway = ?", "key_fp = ?"]
            args += [scope.gateway, scope.key_fingerprint]
        sql = f"SELECT {_COLUMNS} FROM tasks"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._connection() as db:
            rows = db.execute(sql + " ORDER BY created DESC, row DESC", args).fetchall()
        return [_entry(row) for row in rows]

    def mark_saved(self, task_id: str, surface: str, files: Sequence[str | os.PathLike[str]],
                   *, scope: Scope) -> None:  # fmt: skip
        """Records that a task's results were saved where the SDK did not save them (read
        into memory, uploaded): the task is then no longer unfinished.

        Example::

            client.journal.mark_saved(task.id, task.surface, ["s3://bucket/a.png"],
                                      scope=client.journal_scope)
        """
        paths = tuple(Path(os.fspath(f)) for f in files)
        self.record(states.Saved(task_id, surface, paths), scope)

    # ------------------------------------------------------------------------ writing

    def record(self, event: object, scope: Scope) -> None:
        """Commits one event of a flow's (``_core/states.py``); the table decides the move.
        Waits while another writer holds the file (30 s at most). Raises
        :class:`StorageError` if the file cannot be written: a submit is then not sent.
        Example: ``journal.record(event, client.journal_scope)``, as a blocking driver does.
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
            raise StorageError(
                f"cannot write the journal {self.path} ({exc}); nothing was sent",
                code="journal_failed",
            ) from exc

    def try_record(self, event: object, scope: Scope) -> bool:
        """Commits one event as :meth:`record` does, if that takes no waiting: True when it is
        committed (or needs no write); False when nothing was written and the caller should
        call :meth:`record` in a worker thread: another writer holds the file, a checkpoint is
        due or under way, another thread is in here, or the write failed (``record`` says why).
        What an event loop calls, on its own thread. Example::

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

    def close(self) -> None:
        """Closes the file (a journal the client opened from a path is closed with it)."""
        with self._lock, self._loop_lock:
            if self._pid == os.getpid():
                for db in (self._nowait, self._db):
                    if db is not None:
                        db.close()
            self._db = self._nowait = None

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"

    # ------------------------------------------------------------------------ internals

    def _open(self) -> sqlite3.Connection:
        folder = self.path.parent
        if not folder.exists():
            folder.mkdir(mode=0o700, parents=True)
        open_private(self.path)
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                             check_same_thread=False)  # fmt: skip
        try:
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA journal_mode=WAL")
            # A killed process loses nothing committed; a power cut may lose the last moment.
            db.execute("PRAGMA synchronous=NORMAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > FORMAT:
                raise sqlite3.DatabaseError(f"written by a newer imggw (format {version})")
            if version < FORMAT:
                db.executescript(_SCHEMA + f"PRAGMA user_version={FORMAT};")
        except BaseException:
            db.close()
            raise
        return db

    def _open_nowait(self) -> sqlite3.Connection:
        """The event loop's connection (see the module's docstring): no I/O until it writes."""
        db = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
        for pragma in ("busy_timeout=0", "wal_autocheckpoint=0", "synchronous=NORMAL"):
            db.execute(f"PRAGMA {pragma}")  # synchronous as _open's: it is per connection
        return db

    def _write(self, db: sqlite3.Connection, event: object, scope: Scope) -> None:
        """One event in one transaction on ``db`` (its lock held), and its row in the memo."""
        db.execute("BEGIN IMMEDIATE")
        try:
            after = _apply(db, event, scope)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        self._writes += 1
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
        if states.move(state, _event(event)) is not state:
            return False
        new_expires, new_charge = _seen_values(task)
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
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's handles are not ours
                with self._loop_lock:
                    self._db, self._nowait, self._ready, self._due = None, None, False, False
                    self._pid = os.getpid()
                try:
                    self._db = self._open()
                except (OSError, sqlite3.Error, StorageError) as exc:
                    raise unusable(self.path, exc) from exc
            if self._db is None:
                raise ConfigurationError(f"the journal {self.path} is closed",
                                         code="journal_unusable")  # fmt: skip
            yield self._db


def unusable(path: Path, exc: BaseException) -> ConfigurationError:
    why = getattr(exc, "strerror", None) or getattr(exc, "message", None) or str(exc)
    return ConfigurationError(f"cannot use the journal {path} ({why})", code="journal_unusable")


Memo = tuple[tuple[str, str, str, str], State | None, Any, Any]  # key, state, expiry, charge


def _apply(db: sqlite3.Connection, event: object, scope: Scope) -> Memo | None:
    """Runs ``event``'s move on its rows; returns what its one row holds after it (for the
    memo; its state None when the row went, or when the event found no row or several)."""
    base = (scope.gateway, scope.key_fingerprint)
    if isinstance(event, states.Sending):
        request = event.request
        db.execute(
            "INSERT INTO tasks (gateway, key_fp, surface, idempotency_key, state, prompt,"
            " aspect_ratio, resolution, created) VALUES (?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT DO NOTHING",
            (*base, event.surface, event.key, State.UNKNOWN.value, request.prompt,
             request.aspect_ratio, request.resolution, time.time()),
        )  # fmt: skip
        return None
    surface: str
    task_id: str | None
    if isinstance(event, (states.Accepted, states.Refused)):
        if isinstance(event, states.Accepted):
            sub = event.submission
            surface, key, task_id = sub.surface, sub.idempotency_key, sub.task_id
            happened = states.Event.PENDING
        else:
            surface, key, task_id, happened = event.surface, event.key, None, states.Event.REFUSED
        where, args = "idempotency_key = ?", [key]
    else:
        task_id = event.task.id if isinstance(event, states.Seen) else event.task_id  # type: ignore[attr-defined]
        surface = event.task.surface if isinstance(event, states.Seen) else event.surface  # type: ignore[attr-defined]
        where, args = "task_id = ?", [task_id]
        happened = _event(event)
    mine = "gateway = ? AND key_fp = ? AND surface = ?"
    found = db.execute(
        f"SELECT row, state, expires_at, charge FROM tasks WHERE {mine} AND {where}",
        (*base, surface, *args),
    ).fetchall()
    after: tuple[State, Any, Any] | None = None
    for row, state, expires, charge in found:
        target = states.move(State(state), happened)
        if target is None:
            db.execute("DELETE FROM tasks WHERE row = ?", (row,))
            continue
        changes = _changes(event, target)
        sets = ", ".join(f"{name} = ?" for name in changes)
        db.execute(f"UPDATE tasks SET {sets} WHERE row = ?", (*changes.values(), row))
        after = (target, changes.get("expires_at", expires), changes.get("charge", charge))
    if task_id is None:
        return None
    known = after if len(found) == 1 and after is not None else (None, None, None)
    return ((*base, surface, task_id), *known)


def _event(event: object) -> states.Event:
    if isinstance(event, states.Seen):
        return states.event_of(event.task.status)
    if isinstance(event, states.Saved):
        return states.Event.SAVED
    return states.Event.EXPIRED


def _changes(event: object, target: State) -> dict[str, Any]:
    """The columns ``event`` sets on a row that moves to ``target``."""
    changes: dict[str, Any] = {"state": target.value}
    if isinstance(event, states.Accepted):
        changes["task_id"] = event.submission.task_id
        if event.submission.submitted_at is not None:
            changes["submitted_at"] = event.submission.submitted_at.timestamp()
    elif isinstance(event, states.Seen):
        expires, charge = _seen_values(event.task)
        if expires is not None:
            changes["expires_at"] = expires
        if charge is not None:
            changes["charge"] = charge
    elif isinstance(event, states.Saved) and target is State.SAVED:
        changes["files"] = json.dumps([str(path) for path in event.files])
    return changes


def _seen_values(task: Task) -> tuple[float | None, float | None]:
    """The link expiry and charge an answer gives (as stored), each None when it gives none."""
    expires = None if task.expires_at is None else task.expires_at.timestamp()
    charge = task.credits if task.credits is not None else task.cost
    if charge is None or not math.isfinite(charge):
        return expires, None
    return expires, float(charge)


def _entry(row: Sequence[Any]) -> JournalEntry:
    (surface, key, task_id, state, prompt, ratio, resolution, created, submitted, expires,
     charge, files, gateway) = row  # fmt: skip
    status = state if state == State.UNKNOWN.value else _status(State(state))
    return JournalEntry(
        task_id=task_id,
        surface=surface,
        idempotency_key=key,
        status=status,
        submitted_at=_when(submitted),
        expires_at=_when(expires),
        files=tuple(Path(p) for p in json.loads(files)),
        request=ImageRequest.unchecked(prompt, ratio, resolution),
        state=state,
        charge=charge,
        gateway=gateway,
        created_at=_when(created),
    )


def _status(state: State) -> str:
    if state in (State.SAVED, State.EXPIRED):
        return TaskStatus.SUCCEEDED.value
    return TaskStatus(state.value).value


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=timezone.utc)


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def work_of(entry: JournalEntry) -> Work | None:
    """What an entry still needs (from the states table)."""
    return states.WORK.get(State(entry.state))
