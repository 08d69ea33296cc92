"""The batch ledger: one SQLite database (WAL) in the output folder, one row per logical line,
every state change committed before the work that depends on it. A lock file keeps a second
process out; the kernel releases it even if the holder is killed."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core.flows import new_idempotency_key
from .._exceptions import ImggwError, RequestValidationError
from ._input import InputLine

LEDGER_NAME = "ledger.sqlite"
LOCK_NAME = ".imggw-batch.lock"

# Row states. A line only moves forward; `done` may fall back to `succeeded` if its files are
# missing or corrupt, which means "download again".
PENDING = "pending"  # key written, no task id known
SUBMITTED = "submitted"  # task id known, not finished
SUCCEEDED = "succeeded"  # task succeeded, results not (all) saved
DONE = "done"  # results saved and verified
FAILED = "failed"  # the task failed, or the gateway refused the request
EXPIRED = "expired"  # results expired before they could be saved
FINAL = frozenset({DONE, FAILED, EXPIRED})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS lines (
    identity        TEXT PRIMARY KEY,
    line            INTEGER NOT NULL,
    caller_id       TEXT,
    fingerprint     TEXT NOT NULL,
    request         TEXT NOT NULL,
    surface         TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    task_id         TEXT,
    state           TEXT NOT NULL,
    urls            TEXT NOT NULL DEFAULT '[]',
    error_code      TEXT,
    error_message   TEXT,
    files           TEXT NOT NULL DEFAULT '[]',
    credits         REAL,
    cost            REAL,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL
)
"""


class BatchLockedError(ImggwError):
    """Another process is running a batch in this output folder.

    Example::

        except BatchLockedError:
            sys.exit("a batch is already running there")
    """


@dataclass
class Row:
    identity: str
    line: int
    caller_id: str | None
    fingerprint: str
    request: dict[str, str]
    surface: str
    idempotency_key: str
    task_id: str | None
    state: str
    urls: list[str] = field(default_factory=list)
    error_code: str | None = None
    error_message: str | None = None
    files: list[dict[str, Any]] = field(default_factory=list)
    credits: float | None = None
    cost: float | None = None


def fingerprint(line: InputLine, surface: str) -> str:
    r = line.request
    canonical = json.dumps(
        [r.prompt, r.aspect_ratio, r.resolution.lower(), surface], ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class Ledger:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._db = sqlite3.connect(folder / LEDGER_NAME, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)

    @classmethod
    @contextmanager
    def open(cls, folder: Path) -> Iterator[Ledger]:
        """The folder's ledger, locked for this process."""
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RequestValidationError(
                "out_dir", f"cannot use {folder} as the output folder: {exc.strerror}"
            ) from exc
        with _lock(folder / LOCK_NAME):
            ledger = cls(folder)
            try:
                yield ledger
            finally:
                ledger._db.close()

    def plan(self, lines: list[InputLine], surface: str) -> tuple[list[Row], list[InputLine]]:
        """A row for every line: known ones as they were, new ones with a fresh key, changed
        ones (same identity, another request) with a fresh key as a new logical request.
        Every key is committed durably before this returns, hence before any send."""
        existing = {row.identity: row for row in self.rows()}
        changed: list[InputLine] = []
        now = time.time()
        rows: list[Row] = []
        with self._transaction(durable=True):
            for line in lines:
                fp = fingerprint(line, surface)
                row = existing.get(line.identity)
                if row is not None and row.fingerprint == fp:
                    if row.line != line.line:
                        row.line = line.line
                        self._save(row, now)
                    rows.append(row)
                    continue
                if row is not None:
                    changed.append(line)
                row = Row(
                    identity=line.identity,
                    line=line.line,
                    caller_id=line.caller_id,
                    fingerprint=fp,
                    request=line.request.model_dump(),
                    surface=surface,
                    idempotency_key=new_idempotency_key(),
                    task_id=None,
                    state=PENDING,
                )
                self._db.execute(
                    "INSERT OR REPLACE INTO lines (identity, line, caller_id, fingerprint, "
                    "request, surface, idempotency_key, state, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (row.identity, row.line, row.caller_id, fp, json.dumps(row.request),
                     surface, row.idempotency_key, PENDING, now, now),
                )  # fmt: skip
                rows.append(row)
        return rows, changed

    def save(self, row: Row) -> None:
        with self._transaction():
            self._save(row, time.time())

    def _save(self, row: Row, now: float) -> None:
        self._db.execute(
            "UPDATE lines SET line=?, task_id=?, state=?, urls=?, error_code=?, error_message=?, "
            "files=?, credits=?, cost=?, updated_at=? WHERE identity=?",
            (row.line, row.task_id, row.state, json.dumps(row.urls), row.error_code,
             row.error_message, json.dumps(row.files), row.credits, row.cost, now, row.identity),
        )  # fmt: skip

    def rows(self) -> list[Row]:
        cursor = self._db.execute(
            "SELECT identity, line, caller_id, fingerprint, request, surface, idempotency_key, "
            "task_id, state, urls, error_code, error_message, files, credits, cost FROM lines"
        )
        return [
            Row(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7], r[8],
                json.loads(r[9]), r[10], r[11], json.loads(r[12]), r[13], r[14])
            for r in cursor.fetchall()
        ]  # fmt: skip

    @contextmanager
    def _transaction(self, *, durable: bool = False) -> Iterator[None]:
        # Keys must survive even a power cut before their first send: that commit is synced.
        # Later changes can be re-learned from the gateway with the key, so NORMAL is enough.
        if durable:
            self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")
        finally:
            if durable:
                self._db.execute("PRAGMA synchronous=NORMAL")


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BatchLockedError(
                f"another batch is running in {path.parent} (lock {path.name}); wait for it to "
                "finish, or use another output folder",
                code="batch_locked",
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)  # closing releases the lock; the kernel does it too if we are killed
