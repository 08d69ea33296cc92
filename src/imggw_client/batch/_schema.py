"""The ledger's file and the words of its rows: a file of the task store's one table and formats
(``_journal/schema.py``, which brings older ledgers forward), how it is opened (SQLite in WAL
mode, made private, its log kept small), what one of its rows is (:class:`Row`: a line's
columns of that table), the errors of a ledger that is damaged or cannot be written; a
line's states, the moves between them, the words they show as, and how a run ends; and a
ledger file read while another process may be writing it (``imggw batch status``, ``merge``,
a Dask driver's progress), or copied whole while a run writes on (a shard's checkpoints into
a remote output folder): read only, and never through a symbolic link. ``_ledger`` runs the
queries on an open ledger.

A line's state is its task's, a state of the core's one table (``_core/states.py``), kept as is
in its ledger row::

    unknown ──answered──▶ running ──task succeeded──▶ succeeded ──files saved──▶ saved
       │                     │                          │    ▲                     │
       │ refused             │ task failed              │    └── files gone ───────┘
       ▼                     ▼                          ▼
    failed ◀─────────────────┴────── results gone ──▶ expired

- ``unknown``: nothing sent yet, or the submit's answer was lost (its key replays the task).
- ``running``: the task id is known and the task has not finished.
- ``succeeded``: the task succeeded; its files are not (all) saved.
- ``saved``: every file saved and verified.
- ``failed``: refused, the task failed, the gateway does not know the task (error
  ``not_found``), or a bad line.
- ``expired``: the task succeeded, but its results were gone before they could be saved.

A line's moves (:data:`MOVES`) are read off the core's table, with the two moves a batch adds
(:data:`BATCH_MOVES`); its work is the core's ``WORK``. Planning a rerun moves some lines back,
at no cost (:data:`RECHECKS`, carried out by the ledger): each names the work a second look
needs, and its state is the one whose work that is; a look again costs a query or a download,
never a submit.

Outside the ledger a line shows as words computed from its state by :func:`line_state` alone:
the report's and the progress's :class:`LineState` (a task that succeeded and whose files are
not saved is ``downloading``, a line not sent is ``pending``), and from that the manifest's
``status`` and ``imggw batch status`` (:data:`STATUS`: a line whose files are saved is
``succeeded``, one still downloading ``running``, an expired one ``failed``) and the display's
(:data:`WORDS`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sqlite3
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from .._core import states as task
from .._core.models import StrEnum
from .._core.states import State
from .._files import StorageError, cannot, make_private, open_private, refuse_link
from .._journal import schema as store
from .._journal.schema import FORMAT, LEDGER_NAME, RENAMED, STATES_KEPT
from ..tracking._store import NOT_FOUND
from ._lines import COLLECT, GENERATE, request_digest

__all__ = [
    "BATCH_MOVES",
    "ExitCode",
    "FINAL",
    "KEPT",
    "LineState",
    "MOVES",
    "RECHECKS",
    "Recheck",
    "STATUS",
    "STATUSES",
    "WORDS",
    "exit_code",
    "line_counts",
    "line_state",
    "statuses",
    "words",
]


BAD = "bad"  # the kind of a bad input line's row (the others: _lines.GENERATE, COLLECT)

# A line's columns of the store's one table (``_journal/schema.py``), as :class:`Row` holds them.
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
# What a save writes: the line's columns, and its charge (the journal's word: credits where the
# gateway states them, else the cost).
SAVED_COLUMNS = (*COLUMNS, "charge")


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
    ``_schema``), its results, money and times (``submitted_at``: its submit was answered;
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

    def saved_values(self) -> tuple[Any, ...]:
        """What a save writes (:data:`SAVED_COLUMNS`): a charge below 0 is none spent."""
        charge = self.credits if self.credits is not None else self.cost
        return (*self.values(), None if charge is None else max(charge, 0.0))

    @classmethod
    def from_values(cls, values: tuple[Any, ...], version: int = FORMAT) -> Row:
        """The row of a ledger's stored ``values`` (written in format ``version``); one that
        no run of ours wrote (a hand edit, a damaged page) raises :class:`DamagedRow`."""
        named = dict(zip(COLUMNS, values, strict=True))
        try:
            for name, kind in (("fields", dict), ("urls", list), ("files", list)):
                named[name] = json.loads(named[name])
                if not isinstance(named[name], kind):
                    raise TypeError(f"{name} is not a JSON {kind.__name__}")
            named["state"] = state_of(named["state"], version)
            for name in _TEXT:
                if not isinstance(named[name], str) and not (
                    named[name] is None and name in _MAY_BE_NULL
                ):
                    raise TypeError(f"{name} is not text")
            for name in _NUMBERS:
                number, largest = named[name], _LATEST if name in _TIMES else math.inf
                if number is not None and not (
                    isinstance(number, int | float) and abs(number) < largest
                ):
                    raise TypeError(f"{name} is not a number a ledger keeps")
            if named["task_id"] is None and (
                named["kind"] == COLLECT or named["state"] in _HAVE_TASKS
            ):  # a line no run could ever move on: waited on, never asked about
                raise TypeError(f"a {named['kind']} line {named['state'].value} names no task")
        except (ValueError, TypeError) as exc:
            raise DamagedRow(f"its row {str(named['identity'])[:80]!r}: {exc}") from None
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


class DamagedRow(sqlite3.DatabaseError):
    """A ledger row no run wrote: read as SQLite's own damage (``is_damaged``)."""

    sqlite_errorname = "SQLITE_CORRUPT"


_TEXT = ("identity", "kind", "digest", "surface", "idempotency_key", "task_id", "caller_id")
_MAY_BE_NULL = frozenset({"idempotency_key", "task_id", "caller_id"})
_TIMES = ("expires_at", "finished_at", "submitted_at", "completed_at", "first_sent")
_NUMBERS = ("line", "credits", "cost", *_TIMES)  # money: any finite charge a gateway states
_LATEST = 1e11  # Unix seconds past any date a datetime holds (year 5138)
_HAVE_TASKS = frozenset({State.RUNNING, State.SUCCEEDED, State.SAVED})  # a task's answer made them


def state_of(stored: str, version: int = FORMAT) -> State:
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
    """Brings a ledger written by an earlier format forward into the store's one table (its
    rows kept, their states made the core's), or refuses one written by a newer imggw; makes
    the schema where there is none."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > FORMAT:
        raise StorageError(
            f"{path} was written by a newer imggw (ledger format {version}, this one "
            f"reads up to {FORMAT}): upgrade imggw to resume this run",
            code="ledger_too_new",
        )
    store.migrate(db, ledger=True, redigest=_first_digest)


def _first_digest(request: str, surface: str, digest: str) -> str | None:
    """Today's digest of a first-format row whose digest is that format's own (its request
    and surface, without the line's kind); None for any other row, left as it is."""
    try:
        fields: Any = json.loads(request)
        asked = [fields["prompt"], fields["aspect_ratio"], fields["resolution"].lower(), surface]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    first = hashlib.sha256(json.dumps(asked, ensure_ascii=False).encode()).hexdigest()
    return request_digest(*asked) if first == digest else None


def table(version: int) -> str:
    """The table a ledger of format ``version`` keeps its lines in (a file read only is not
    brought forward)."""
    return "tasks" if version >= FORMAT else "lines"


UNKNOWN, RUNNING, SUCCEEDED = State.UNKNOWN, State.RUNNING, State.SUCCEEDED
SAVED, FAILED, EXPIRED = State.SAVED, State.FAILED, State.EXPIRED
# The states a ledger row holds: a line's task is never kept as queued (``pending``, a task a
# run has not seen start is ``running``) nor as forgotten (a failed line, error `not_found`).
KEPT = (UNKNOWN, RUNNING, SUCCEEDED, SAVED, FAILED, EXPIRED)
FINAL = frozenset(state for state in KEPT if task.WORK[state] is None)


class LineState(StrEnum):
    """How a line shows in a report and in progress (``report.counts``): its state's word, as
    :func:`line_state` computes it (see the module's diagram).

    Example::

        report = run_batch("prompts.jsonl", "out/")
        print(report.counts.get(LineState.SAVED, 0), "lines saved")
    """

    PENDING = "pending"
    RUNNING = "running"
    DOWNLOADING = "downloading"
    SAVED = "saved"
    FAILED = "failed"
    EXPIRED = "expired"


def line_state(state: State) -> LineState:
    """The word a line in ``state`` shows as: the one place a state becomes a word."""
    return _SHOWN[state]


_SHOWN: Mapping[State, LineState] = {
    State.UNKNOWN: LineState.PENDING,
    State.PENDING: LineState.RUNNING,
    State.RUNNING: LineState.RUNNING,
    State.SUCCEEDED: LineState.DOWNLOADING,
    State.SAVED: LineState.SAVED,
    State.FAILED: LineState.FAILED,
    State.EXPIRED: LineState.EXPIRED,
    State.NOT_FOUND: LineState.FAILED,
}


def line_counts(counts: Mapping[State, int]) -> dict[LineState, int]:
    """Lines per :class:`LineState` from lines per state (states with no line left out)."""
    found: dict[LineState, int] = {}
    for state, n in counts.items():
        if n:
            word = line_state(State(state))
            found[word] = found.get(word, 0) + n
    return found


# The moves a batch makes that a journal does not: a download that fails for good (a page served
# in place of an image) fails its line; a saved line whose files are missing or damaged, found
# when a run begins, is downloaded again.
BATCH_MOVES: frozenset[tuple[State, State]] = frozenset({(SUCCEEDED, FAILED), (SAVED, SUCCEEDED)})


def _kept(target: State | None) -> State | None:
    """Where a move of the core's table leaves a line: a submit refused (a journal drops its
    row) and a task the gateway forgot are failed lines, their error saying which; a queued
    task is running."""
    if target is None or target is State.NOT_FOUND:
        return FAILED
    return RUNNING if target is State.PENDING else target


def _moves() -> dict[State, frozenset[State]]:
    """Each kept state's moves: those of the core's table by every event, and the batch's own."""
    moves: dict[State, set[State]] = {state: set() for state in KEPT}
    for state in KEPT:
        for event in task.Event:
            target = _kept(task.move(state, event))
            if target is not state and target is not None:
                moves[state].add(target)
    for before, after in BATCH_MOVES:
        moves[before].add(after)
    return {state: frozenset(targets) for state, targets in moves.items()}


# The moves a run makes (``RunLines.move`` holds every move to them).
MOVES: Mapping[State, frozenset[State]] = _moves()


@dataclass(frozen=True)
class Recheck:
    """A move back a plan makes (the ledger carries it out) for what a second look may find
    otherwise at no cost: lines in ``state`` that carry what the other fields ask (a task id or
    none; result links; an error code; a kind of line) are given ``work`` again, in the state
    (:attr:`to`) whose work that is."""

    state: State
    work: task.Work
    task_id: bool
    urls: bool = False
    error: str | None = None
    kind: str | None = None

    @property
    def to(self) -> State:
        """The kept state whose work is :attr:`work`."""
        return next(state for state in KEPT if task.WORK[state] is self.work)


# In this order (a line takes the first that fits).
RECHECKS: tuple[Recheck, ...] = (
    # links that died, or a document served in place of an image: ask for fresh links
    Recheck(EXPIRED, task.Work.DOWNLOAD, task_id=True),
    Recheck(FAILED, task.Work.DOWNLOAD, task_id=True, urls=True),
    # a task the gateway did not know (a replica behind): ask again
    Recheck(FAILED, task.Work.WAIT, task_id=True, error=NOT_FOUND),
    # a submit answered 404 (a wrong base URL): nothing was made, its key submits it now
    Recheck(FAILED, task.Work.RESEND, task_id=False, error=NOT_FOUND, kind=GENERATE),
)

# The words of the manifest's ``status`` and of ``imggw batch status``, in their order.
STATUSES = ("pending", "running", "succeeded", "failed")
STATUS: Mapping[LineState, str] = {
    LineState.PENDING: "pending",
    LineState.RUNNING: "running",
    LineState.DOWNLOADING: "running",
    LineState.SAVED: "succeeded",
    LineState.FAILED: "failed",
    LineState.EXPIRED: "failed",
}
# The display's words: `running` split into the task running and its files downloading.
WORDS: Mapping[str, tuple[LineState, ...]] = {
    "pending": (LineState.PENDING,),
    "running": (LineState.RUNNING,),
    "downloading": (LineState.DOWNLOADING,),
    "succeeded": (LineState.SAVED,),
    "failed": (LineState.FAILED, LineState.EXPIRED),
}


class ExitCode(int, Enum):
    """How a batch (or a collect, a shard, a merge) ends, as ``imggw batch`` exits.

    Example::

        sys.exit(run_batch("prompts.jsonl", "out/").exit_code)
    """

    OK = 0  # every line saved
    SOME_FAILED = 1  # some lines failed, expired or were bad input
    UNFINISHED = 3  # some lines are unfinished: the same command resumes them
    STOPPED = 6  # a guard stopped new submits: raise the limit and run again to resume


def exit_code(
    counts: Mapping[str, int], *, bad: int = 0, stopped_by: str | None = None
) -> ExitCode:
    """The one map from how a run's lines ended to its exit code. ``counts`` counts lines per
    word of :data:`STATUSES` (other keys are ignored), ``bad`` the bad input lines skipped,
    ``stopped_by`` the guard that stopped the run, if one did.
    """
    if stopped_by is not None:
        return ExitCode.STOPPED
    if counts.get("pending", 0) or counts.get("running", 0):
        return ExitCode.UNFINISHED
    if bad or counts.get("failed", 0):
        return ExitCode.SOME_FAILED
    return ExitCode.OK


def words(counts: Mapping[LineState, int] | Mapping[str, int]) -> dict[str, int]:
    """Lines per word of :data:`WORDS` (every word, zeros included) from lines per state."""
    return {word: sum(counts.get(state, 0) for state in of) for word, of in WORDS.items()}


def statuses(counts: Mapping[LineState, int] | Mapping[str, int]) -> dict[str, int]:
    """Lines per word of :data:`STATUSES` (every word, zeros included) from lines per state."""
    found = dict.fromkeys(STATUSES, 0)
    for state, n in counts.items():
        found[STATUS[LineState(state)]] += n
    return found


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[tuple[sqlite3.Connection, int, int] | None]:
    """A ledger file opened read only (a live run, another process, may be writing it), its
    last plan and its format (its rows are read as that format wrote them); None when it holds
    no plan (or is no ledger). A symbolic link planted in its place is refused, not read."""

    refuse_link(path)
    try:
        # A reader left half-read (a merge that stopped early) is closed when the garbage
        # collector finds it, in whatever thread runs then: a read-only connection may be.
        db = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0, check_same_thread=False
        )
    except sqlite3.Error:
        yield None
        return
    with contextlib.closing(db):
        try:
            # The format and the rows from one snapshot: a run may bring the file forward
            # (its lines moved into another table) between two reads.
            db.execute("BEGIN")
            found = db.execute("SELECT value FROM meta WHERE key='plan'").fetchone()
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error:
            found = None
        yield (db, int(found[0]), version) if found is not None else None


def read_rows(path: Path) -> Iterator[Row]:
    """Every row of a ledger file's last plan, in line order, read only: what ``status`` and
    ``merge`` read of a shard's ledger or checkpoint. A damaged ledger (or a row no run wrote)
    raises the ``ledger_damaged`` error; whatever else cannot be read (a live run's file
    between two states) ends the rows."""
    with _read_only(path) as opened:
        if opened is None:
            return
        db, plan, version = opened
        try:
            cursor = db.execute(
                f"SELECT {', '.join(COLUMNS)} FROM {table(version)} WHERE planned=? ORDER BY line",
                (plan,),
            )
            for values in cursor:
                yield Row.from_values(values, version)
        except sqlite3.Error as exc:
            if is_damaged(exc):  # else read as far as it goes: no line counted twice
                raise damaged_ledger(path, exc) from None


def count_statuses(path: Path) -> dict[str, int] | None:
    """Lines per word of :data:`STATUSES` in a ledger file's last plan (bad input lines
    as ``bad``), read only and summed by SQLite: cheap enough to read every few seconds while
    a shard runs. None when the file holds no plan yet."""
    with _read_only(path) as opened:
        if opened is None:
            return None
        db, plan, version = opened
        found: Counter[str] = Counter()
        for bad, state, n in db.execute(
            f"SELECT kind=?, state, COUNT(*) FROM {table(version)} WHERE planned=? GROUP BY 1, 2",
            (BAD, plan),
        ):
            found["bad" if bad else STATUS[line_state(state_of(state, version))]] += n
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
            private_database(copy)
            with contextlib.closing(sqlite3.connect(copy)) as into:
                db.backup(into)
    except sqlite3.Error as exc:
        raise StorageError(
            f"cannot checkpoint {path} ({exc}); the same command resumes", code="storage_failed"
        ) from exc


# The meta key of what tasks of lines changed since were charged, {task id: [credits, cost]}:
# their rows are made anew for the new request, and a cap still counts what the old ones cost
# (once: a line changed back replays its task, and its row counts it again).
REPLACED = "replaced_charges"
# What the rows of a ledger's table were charged, credits and cost, bad input lines left out.
SPENT = "SELECT TOTAL(MAX(credits, 0)), TOTAL(MAX(cost, 0)) FROM {table} WHERE kind!=?"


def replaced_of(text: str | None, path: Path | str) -> dict[str, list[float]]:
    """The replaced charges a ledger keeps (``{task_id: [credits, cost]}``); a value no run
    wrote (the folder is anyone's to edit) is a damaged ledger, never a cap read as lower
    than it is."""
    try:
        replaced = json.loads(text or "{}")
        if isinstance(replaced, dict) and all(
            isinstance(v, list) and len(v) == 2 and all(_charge(c) for c in v)
            for v in replaced.values()
        ):
            return replaced
    except (ValueError, RecursionError):
        pass
    raise storage_error(path, DamagedRow(f"its meta {REPLACED!r} is not a run's"))


def _charge(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < math.inf


def charged_apart(path: Path) -> tuple[float, float, dict[str, list[float]]]:
    """What a ledger file's lines outside its last plan (removed from the input since) were
    charged, credits and cost, and its replaced charges by task id: what a cap counts beside
    the last plan's lines (:func:`read_rows`). Read only."""
    with _read_only(path) as opened:
        if opened is None:
            return 0.0, 0.0, {}
        db, plan, version = opened
        try:
            credits, cost = db.execute(
                SPENT.format(table=table(version)) + " AND planned!=?", (BAD, plan)
            ).fetchone()
            found = db.execute("SELECT value FROM meta WHERE key=?", (REPLACED,)).fetchone()
        except sqlite3.Error as exc:  # never read as nothing charged: a cap would pass
            raise storage_error(path, exc, "read") from None
    return credits, cost, replaced_of(None if found is None else str(found[0]), path)


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
