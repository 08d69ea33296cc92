"""The journal: one SQLite file that keeps every paid task a client submits, from before its
request leaves until its results are saved (DESIGN 19).

Several processes (and threads) may share one file: WAL, a busy timeout, a short transaction
per event. A row is committed before its submit is sent, so a process killed at any moment
leaves every task it may have paid for on disk, with the idempotency key that finds it again.
The state a row moves to is decided by the one table in ``_core/states.py``.

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
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._core import states
from .._core.exceptions import ConfigurationError
from .._core.models import ImageRequest, TaskStatus
from .._core.states import State, Work
from .._files import StorageError, open_private

__all__ = ["Journal", "JournalEntry", "Scope"]

FORMAT = 1
BUSY_TIMEOUT_MS = 30_000  # many CLI processes at once wait for each other, never "locked"

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
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._pid = os.getpid()
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
        Raises :class:`StorageError` if the file cannot be written: a submit is then not
        sent."""
        try:
            with self._connection() as db:
                db.execute("BEGIN IMMEDIATE")
                try:
                    _apply(db, event, scope)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageError(
                f"cannot write the journal {self.path} ({exc}); nothing was sent",
                code="journal_failed",
            ) from exc

    def close(self) -> None:
        """Closes the file (a journal the client opened from a path is closed with it)."""
        with self._lock:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None

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

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's handle is not ours
                self._db, self._pid = None, os.getpid()
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


def _apply(db: sqlite3.Connection, event: object, scope: Scope) -> None:
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
        return
    surface: str
    if isinstance(event, (states.Accepted, states.Refused)):
        if isinstance(event, states.Accepted):
            sub = event.submission
            surface, key, happened = sub.surface, sub.idempotency_key, states.Event.PENDING
        else:
            surface, key, happened = event.surface, event.key, states.Event.REFUSED
        where, args = "idempotency_key = ?", [key]
    else:
        task_id = event.task.id if isinstance(event, states.Seen) else event.task_id  # type: ignore[attr-defined]
        surface = event.task.surface if isinstance(event, states.Seen) else event.surface  # type: ignore[attr-defined]
        where, args = "task_id = ?", [task_id]
        happened = _event(event)
    mine = "gateway = ? AND key_fp = ? AND surface = ?"
    found = db.execute(
        f"SELECT row, state FROM tasks WHERE {mine} AND {where}", (*base, surface, *args)
    ).fetchall()
    for row, state in found:
        target = states.move(State(state), happened)
        if target is None:
            db.execute("DELETE FROM tasks WHERE row = ?", (row,))
            continue
        sets, values = _changes(event, target)
        db.execute(f"UPDATE tasks SET {sets} WHERE row = ?", (*values, row))


def _event(event: object) -> states.Event:
    if isinstance(event, states.Seen):
        return states.event_of(event.task.status)
    if isinstance(event, states.Saved):
        return states.Event.SAVED
    return states.Event.EXPIRED


def _changes(event: object, target: State) -> tuple[str, tuple[Any, ...]]:
    names: list[str] = ["state"]
    values: list[Any] = [target.value]
    if isinstance(event, states.Accepted):
        names.append("task_id")
        values.append(event.submission.task_id)
        if event.submission.submitted_at is not None:
            names.append("submitted_at")
            values.append(event.submission.submitted_at.timestamp())
    elif isinstance(event, states.Seen):
        task = event.task
        if task.expires_at is not None:
            names.append("expires_at")
            values.append(task.expires_at.timestamp())
        charge = task.credits if task.credits is not None else task.cost
        if charge is not None and math.isfinite(charge):
            names.append("charge")
            values.append(float(charge))
    elif isinstance(event, states.Saved) and target is State.SAVED:
        names.append("files")
        values.append(json.dumps([str(path) for path in event.files]))
    return ", ".join(f"{name} = ?" for name in names), tuple(values)


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
