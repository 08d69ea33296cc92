"""A batch line's states, the moves between them, the word each shows as, and how a run ends.

Every line of a run is in one state, kept in its ledger row::

    pending ──submitted──▶ running ──task succeeded──▶ downloading ──files saved──▶ saved
       │                      │                          │    ▲                      │
       │ refused              │ task failed              │    └── files gone ────────┘
       ▼                      ▼                          ▼
    failed ◀──────────────────┴────── results gone ──▶ expired

- ``pending``: nothing sent yet, or the submit's answer was lost (its key replays the task).
- ``running``: the task id is known and the task has not finished.
- ``downloading``: the task succeeded; its files are not (all) saved.
- ``saved``: every file saved and verified.
- ``failed``: refused, the task failed, the gateway does not know the task, or a bad line.
- ``expired``: the task succeeded, but its results were gone before they could be saved.

Each line state is a task state of the core's one table (``_core/states.py``; :data:`TASK_STATE`):
a line's moves (:data:`MOVES`) and its work (:data:`WORK`) are read off that table, with the two
moves a batch adds (:data:`BATCH_MOVES`). Planning a rerun moves some lines back, at no cost
(:data:`RECHECKS`, carried out by the ledger): each names the work a second look needs, and
its line state is the one whose work that is; a look again costs a query or a download, never a
submit.

One word per line state outside the ledger (the manifest's ``status``, ``imggw batch
status``, the gallery): what the line delivered (:data:`STATUS`). ``succeeded`` is a line whose
files are saved; a line whose task succeeded but whose files are not saved yet is ``running``;
a line whose results expired is ``failed`` (error ``result_expired``). The display alone splits
``running`` in two (:data:`WORDS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from .._core import states as task
from ..tracking._store import NOT_FOUND
from ._lines import GENERATE

__all__ = [
    "FINAL",
    "BATCH_MOVES",
    "LEGACY",
    "LINE_STATE",
    "MOVES",
    "RECHECKS",
    "STATUS",
    "STATUSES",
    "TASK_STATE",
    "WORDS",
    "WORK",
    "ExitCode",
    "LineState",
    "Recheck",
    "exit_code",
    "statuses",
    "words",
]


class LineState(str, Enum):
    """The state of one line of a batch, as its ledger keeps it (see the module's diagram).

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

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:  # f"{state}" is its value on every Python
        return format(self.value, spec)


PENDING, RUNNING, DOWNLOADING, SAVED, FAILED, EXPIRED = LineState
FINAL = frozenset({SAVED, FAILED, EXPIRED})

# The task state each line state is: the core's table decides their moves and their work. A
# pending line's submit may have left or not; its key sends it either way (the task replayed).
TASK_STATE: Mapping[LineState, task.State] = {
    PENDING: task.State.UNKNOWN,
    RUNNING: task.State.RUNNING,
    DOWNLOADING: task.State.SUCCEEDED,
    SAVED: task.State.SAVED,
    FAILED: task.State.FAILED,
    EXPIRED: task.State.EXPIRED,
}
# The line state of each task state: a task known and not finished is running; a submit refused
# (no task: a journal drops its row) is a failed line the manifest tells of, as is a task the
# gateway no longer knows (error `not_found`).
LINE_STATE: Mapping[task.State | None, LineState] = {
    **{state: line for line, state in TASK_STATE.items()},
    task.State.PENDING: RUNNING,
    task.State.NOT_FOUND: FAILED,
    None: FAILED,
}
# What each line still needs (None: final), read off the core's table.
WORK: Mapping[LineState, task.Work | None] = {
    line: task.WORK[state] for line, state in TASK_STATE.items()
}
# The moves a batch makes that a journal does not: a download that fails for good (a page served
# in place of an image) fails its line; a saved line whose files are missing or damaged, found
# when a run begins, is downloaded again.
BATCH_MOVES: frozenset[tuple[LineState, LineState]] = frozenset(
    {(DOWNLOADING, FAILED), (SAVED, DOWNLOADING)}
)


def _moves() -> dict[LineState, frozenset[LineState]]:
    """Each line state's moves: those of its task state by every event of the core's table,
    and the batch's own."""
    moves: dict[LineState, set[LineState]] = {line: set() for line in LineState}
    for line, state in TASK_STATE.items():
        for event in task.Event:
            target = LINE_STATE[task.move(state, event)]
            if target is not line:
                moves[line].add(target)
    for before, after in BATCH_MOVES:
        moves[before].add(after)
    return {line: frozenset(targets) for line, targets in moves.items()}


# The moves a run makes (``RunLines.move`` holds every move to them).
MOVES: Mapping[LineState, frozenset[LineState]] = _moves()


@dataclass(frozen=True)
class Recheck:
    """A move back a plan makes (the ledger carries it out) for what a second look may find
    otherwise at no cost: lines in ``state`` that carry what the other fields ask (a task id or
    none; result links; an error code; a kind of line) are given ``work`` again, in the line
    state (:attr:`to`) whose work that is.

    Example::

        Recheck(EXPIRED, task.Work.DOWNLOAD, task_id=True).to   # DOWNLOADING
    """

    state: LineState
    work: task.Work
    task_id: bool
    urls: bool = False
    error: str | None = None
    kind: str | None = None

    @property
    def to(self) -> LineState:
        """The line state whose work is :attr:`work`."""
        return next(line for line, work in WORK.items() if work is self.work)


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
    PENDING: "pending",
    RUNNING: "running",
    DOWNLOADING: "running",
    SAVED: "succeeded",
    FAILED: "failed",
    EXPIRED: "failed",
}
# The display's words: `running` split into the task running and its files downloading.
WORDS: Mapping[str, tuple[LineState, ...]] = {
    "pending": (PENDING,),
    "running": (RUNNING,),
    "downloading": (DOWNLOADING,),
    "succeeded": (SAVED,),
    "failed": (FAILED, EXPIRED),
}

# What ledgers written before the states had these names keep (their rows are moved to the
# new names when the ledger is opened to run; read-only readers translate them). "submitted"
# was beta's wire word and "succeeded" the manifest's, each with another meaning.
LEGACY: Mapping[str, LineState] = {
    "submitted": RUNNING,
    "succeeded": DOWNLOADING,
    "done": SAVED,
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

    Example::

        exit_code({"succeeded": 9, "failed": 1})   # ExitCode.SOME_FAILED
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
