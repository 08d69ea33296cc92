"""The batch ledger: one SQLite database (WAL) per run or shard, one row per input line. This
module runs everything asked of an open ledger (planning, reading, writing); its file, schema
and rows are ``_schema``'s, and so is reading a ledger another process writes.

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

from .._core.exceptions import ImggwError, RequestValidationError
from .._core.states import State
from .._files import StorageError, refuse_link
from .._journal.schema import LEDGER_NAME, transaction
from ._lines import GENERATE
from ._schema import (
    BAD,
    COLUMNS,
    EXPIRED,
    RECHECKS,
    REPLACED,
    RUNNING,
    SAVED,
    SAVED_COLUMNS,
    SPENT,
    SUCCEEDED,
    Row,
    connect,
    migrate,
    private_database,
    replaced_of,
    state_of,
    storage_error,
)

LOCK_NAME = ".imggw-batch.lock"
INVALID_LINE = "invalid_line"  # a bad input line's error code
STOPPED_BY = "stopped_by"  # the meta key of the guard that stopped the last run's submits
_LINKS_BLANKED = "links_blanked"  # the meta key of a ledger whose links keep no key


def is_locked(folder: Path) -> bool:
    """Whether a run holds ``folder``'s lock now (taken and let go at once when free; never
    through a planted link). What ``batch status`` says as ``active``."""
    path = folder / LOCK_NAME
    refuse_link(path)
    if not path.exists():
        return False
    lock = filelock.FileLock(str(path), blocking=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        return True
    except OSError:  # a folder we cannot write: no run of ours holds it either
        return False
    lock.release()
    return False


class BatchLockedError(ImggwError):
    """Another process is running a batch in this output folder.

    Example::

        try:
            run_batch("prompts.jsonl", "out/")
        except BatchLockedError:
            sys.exit("a batch is already running there")
    """


@dataclass
class Totals:
    """Lines per state, and the money they cost, for one plan. ``cost_unknown`` counts the
    lines charged in credits whose gateway stated no cost (surface alpha): their cost is not
    zero, it is not known."""

    counts: Counter[State] = field(default_factory=Counter)
    credits: float = 0.0
    cost: float = 0.0
    cost_unknown: int = 0


class Ledger:
    """A run's (or shard's) ledger. Open it with :meth:`open`; rows change through
    :meth:`save`, which a writer thread commits in groups."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.created = not path.exists()  # made by this process: see discard()
        try:
            private_database(path)
            self._db = connect(path, check_same_thread=False)
            migrate(self._db, path)
            last = self._db.execute("SELECT value FROM meta WHERE key='plan'").fetchone()
        except (sqlite3.Error, OSError) as exc:
            if hasattr(self, "_db"):
                self._db.close()
            raise storage_error(path, exc) from exc
        self._plan = int(last[0]) if last else 0  # the last plan committed: what a reader sees
        self.replaced: list[int] = []
        # Every use of the connection, and its close: a plan's thread may still be writing
        # when a cancel closes the ledger, and SQLite must not be closed under a statement.
        self._read_lock = threading.Lock()
        self._closed = False
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

    # ------------------------------------------------------------------------ planning

    def begin_plan(self) -> int:
        """Starts a plan (one pass over the input), in one transaction: it commits whole or
        not at all. Returns the plan's number."""
        self.replaced = []  # lines of this plan whose paid rows it made anew
        with self._open():
            self._db.execute("BEGIN IMMEDIATE")
        self._plan += 1
        return self._plan

    def plan_line(self, row: Row) -> tuple[Row, bool] | None:
        """Puts a line of the input into the plan: its row as it was if the line is known and
        unchanged, else a new row. Returns (row, new), or None if another line of this plan
        has the same identity."""
        with self._open():
            return self._plan_line(row)

    def _plan_line(self, row: Row) -> tuple[Row, bool] | None:
        found = self._db.execute(
            f"SELECT planned, {', '.join(COLUMNS)} FROM tasks WHERE identity=?", (row.identity,)
        ).fetchone()
        now = time.time()
        if found is not None and found[0] == self._plan:
            return None
        if found is not None:
            old = Row.from_values(found[1:])
            if old.digest == row.digest:
                old.line, old.fields = row.line, row.fields or old.fields
                self._db.execute(
                    "UPDATE tasks SET line=?, fields=?, planned=? WHERE identity=?",
                    (
                        old.line,
                        json.dumps(old.fields, ensure_ascii=False),
                        self._plan,
                        old.identity,
                    ),
                )
                return old, False
        if found is not None:  # changed: what its task was charged still counts
            old = Row.from_values(found[1:])
            if old.task_id is not None or old.first_sent is not None:
                self.replaced.append(row.line)  # a paid line made anew: a change, whatever
            if (old.credits or old.cost) and old.task_id is not None:
                replaced = self._replaced()
                replaced[old.task_id] = [max(old.credits or 0.0, 0.0), max(old.cost or 0.0, 0.0)]
                self._db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                    (REPLACED, json.dumps(replaced)),
                )
        self._db.execute(
            f"INSERT OR REPLACE INTO tasks ({', '.join(SAVED_COLUMNS)}, planned, created, "
            f"changed) VALUES ({', '.join('?' * (len(SAVED_COLUMNS) + 3))})",
            (*row.saved_values(), self._plan, now, now),
        )
        return row, True

    def recheck(self) -> None:
        """Within a plan: the moves back of ``_schema.RECHECKS``, in their order. Lines that
        failed for what a later look may find otherwise, at no cost (a task the gateway did not
        know; a task that succeeded but whose results could not be saved: links that died, a
        document served in place of an image; a submit answered 404, which made nothing), are
        looked at again by this run: a query and a download, or a submit with the line's own
        key."""
        with self._open():
            self._recheck()

    def _recheck(self) -> None:
        for rule in RECHECKS:
            where, args = ["planned=?", "state=?"], [self._plan, rule.state.value]
            where.append("task_id IS NOT NULL" if rule.task_id else "task_id IS NULL")
            if rule.urls:
                where.append("urls != '[]'")
            if rule.error is not None:
                where.append("error_code=?")
                args.append(rule.error)
            if rule.kind is not None:
                where.append("kind=?")
                args.append(rule.kind)
            self._db.execute(
                "UPDATE tasks SET state=?, error_code=NULL, error_message=NULL "
                f"WHERE {' AND '.join(where)}",
                (rule.to.value, *args),
            )

    def end_plan(self, *, commit: bool) -> None:
        """Ends the plan: committed, or rolled back (as closing the ledger did already)."""
        with self._read_lock:
            if not self._closed:
                self._end_plan(commit)

    def _end_plan(self, commit: bool) -> None:
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
        """The highest price (credits, cost) seen per resolution among the folder's lines
        (of any plan): what the run's guards estimate a line at. As ``settles`` has it, a
        price is a positive charge, or the final one of a task that succeeded: the 0 a task
        states while it runs, or a failed task's, is none."""
        succeeded = [SUCCEEDED.value, SAVED.value, EXPIRED.value]
        with self._read_lock:
            found = self._db.execute(
                "SELECT json_extract(fields, '$.resolution'), MAX(credits), MAX(cost) FROM tasks "
                "WHERE (credits IS NOT NULL OR cost IS NOT NULL) AND ("
                f"state IN ({', '.join('?' * len(succeeded))}) "
                "OR ((credits IS NULL OR credits > 0) AND (cost IS NULL OR cost > 0))) GROUP BY 1",
                succeeded,
            )
            return {str(res or ""): (credits, cost) for res, credits, cost in found}

    def waiting_by_resolution(self, state: State) -> dict[str, int]:
        """Generate lines in ``state`` per resolution (``unknown``: what is left to submit;
        ``running``: what was sent and is not charged yet, with no charge stated)."""
        uncharged = " AND credits IS NULL AND cost IS NULL" if state is RUNNING else ""
        with self._read_lock:
            found = self._db.execute(
                "SELECT json_extract(fields, '$.resolution'), COUNT(*) FROM tasks "
                f"WHERE planned=? AND kind=? AND state=?{uncharged} GROUP BY 1",
                (self._plan, GENERATE, state.value),
            )
            return {str(res or ""): n for res, n in found}

    def unsaved_by_resolution(self) -> dict[str, int]:
        """Lines whose results are still to be saved (``running``, ``succeeded``) per
        resolution (``""``: not stated, as for a collected task): the room a run keeps free."""
        with self._read_lock:
            found = self._db.execute(
                "SELECT json_extract(fields, '$.resolution'), COUNT(*) FROM tasks "
                "WHERE planned=? AND kind!=? AND state IN (?, ?) GROUP BY 1",
                (self._plan, BAD, RUNNING.value, SUCCEEDED.value),
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
                " FROM tasks WHERE kind=? AND submitted_at IS NOT NULL"
                " AND completed_at IS NOT NULL)"
                " WHERE n <= ? ORDER BY surface, resolution, n DESC",
                (GENERATE, newest),
            ):
                found.setdefault((str(surface), str(resolution or "")), []).append(float(took))
        return found

    def kinds(self) -> Counter[tuple[str, State]]:
        """The plan's lines per (kind, state): what a dry run tells."""
        found: Counter[tuple[str, State]] = Counter()
        with self._read_lock:
            for kind, state, n in self._db.execute(
                "SELECT kind, state, COUNT(*) FROM tasks WHERE planned=? GROUP BY 1, 2",
                (self._plan,),
            ):
                found[(str(kind), state_of(state))] += n
        return found

    def spent(self) -> tuple[float, float]:
        """What the folder's runs were charged (credits, cost): every line's, of any plan (a
        line since removed from the input too), and what changed lines' tasks were charged
        before their rows were made anew. What a cap holds to across reruns."""
        with self._read_lock:
            credits, cost = self._db.execute(SPENT.format(table="tasks"), (BAD,)).fetchone()
            replaced = self._replaced()
            ids = list(replaced)
            for at in range(0, len(ids), 500):  # a task a row holds again is counted there
                chunk = ids[at : at + 500]
                for (task_id,) in self._db.execute(
                    f"SELECT task_id FROM tasks WHERE task_id IN ({', '.join('?' * len(chunk))})",
                    chunk,
                ):
                    replaced.pop(task_id, None)
        return (
            credits + sum(c for c, _ in replaced.values()),
            cost + sum(c for _, c in replaced.values()),
        )

    def _replaced(self) -> dict[str, list[float]]:
        """What replaced rows' tasks were charged, by task id (:func:`replaced_of`)."""
        return replaced_of(self._meta(REPLACED), self.path)

    def get_meta(self, key: str) -> str | None:
        """A value the run keeps beside its lines (``stopped_by``, say)."""
        with self._read_lock:
            return self._meta(key)

    def _meta(self, key: str) -> str | None:
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

    def blank_links(self, redact: Callable[[str], str]) -> int:
        """Keeps every link the ledger holds as ``redact`` makes it (a client's
        :meth:`~imggw_client.AsyncClient.redact_url`), and wipes the old bytes (SQLite's secure
        delete, then a log truncated): ledgers written before links carrying the API key were
        kept blanked hold it in clear. Returns how many lines changed. Blocking."""
        if self.get_meta(_LINKS_BLANKED) is not None:
            return 0  # a ledger once looked through keeps its links blanked from then on
        with self._read_lock:
            try:
                changes = []
                for identity, kept in self._db.execute(
                    "SELECT identity, urls FROM tasks WHERE urls != '[]'"
                ):
                    links = json.loads(kept)
                    blanked = [redact(link) for link in links]
                    if blanked != links:
                        changes.append((json.dumps(blanked), identity))
                self._db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, '1')", (_LINKS_BLANKED,)
                )
                if not changes:
                    return 0
                self._db.execute("PRAGMA secure_delete=ON")
                self._db.executemany("UPDATE tasks SET urls=? WHERE identity=?", changes)
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._db.execute("PRAGMA secure_delete=OFF")  # the rest costs no more I/O
            except sqlite3.Error as exc:
                raise storage_error(self.path, exc) from exc
        return len(changes)

    def last_surfaces(self) -> set[str]:
        """The surfaces the last plan's generate lines ran on (at most two are told apart):
        a run whose ``run.json`` predates keeping it is told by its ledger."""
        found = self._db.execute(
            "SELECT DISTINCT surface FROM tasks WHERE planned=? AND kind=? LIMIT 2",
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
                "SUM(credits IS NOT NULL AND cost IS NULL) FROM tasks "
                "WHERE planned=? AND kind!=? GROUP BY state",
                (self._plan, BAD),
            ):
                totals.counts[state_of(state)] += n
                totals.credits += credits
                totals.cost += cost
                totals.cost_unknown += unknown or 0
        return totals

    def rows(
        self, *, after: int = 0, limit: int = 1000, states: tuple[State, ...] = ()
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
                    f"SELECT {', '.join(COLUMNS)} FROM tasks WHERE {where} ORDER BY line LIMIT ?",
                    (*args, limit),
                )
                return [Row.from_values(values) for values in cursor.fetchall()]
        except sqlite3.Error as exc:
            raise storage_error(self.path, exc) from exc

    def next_rows(self, after: int) -> list[Row]:
        """The next chunk of the plan's rows past line ``after`` (for a streaming reader)."""
        return self.rows(after=after, limit=500)

    def iter_rows(self, states: tuple[State, ...] = (), chunk: int = 1000) -> Iterator[Row]:
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
        self._queue.put((*row.saved_values(), time.time(), row.identity))

    def save_now(self, row: Row) -> None:
        """Writes one row at once, in the caller's thread (outside a run's event loop)."""
        try:
            self._update([(*row.saved_values(), time.time(), row.identity)])
        except sqlite3.Error as exc:
            raise storage_error(self.path, exc) from exc

    def flush(self) -> None:
        """Waits until every queued save is committed; raises the writer's failure."""
        if self._writer is not None:
            self._queue.join()
        if self._failure is not None:
            raise self._failure

    def _update(self, values: list[tuple[Any, ...]]) -> None:
        assignments = ", ".join(f"{name}=?" for name in SAVED_COLUMNS)
        with self._read_lock, transaction(self._db) as db:
            db.executemany(f"UPDATE tasks SET {assignments}, changed=? WHERE identity=?", values)

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
        with self._read_lock, contextlib.suppress(sqlite3.Error):
            self._closed = True
            self._db.close()

    @contextlib.contextmanager
    def _open(self) -> Iterator[None]:
        """The connection held for one use; a closed ledger is an error, not a crash."""
        with self._read_lock:
            if self._closed:
                raise sqlite3.ProgrammingError(f"the ledger {self.path} is closed")
            yield

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
