"""A batch line's states, the moves between them, the words they show as, and how a run ends.

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

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from .._core import states as task
from .._core.states import State
from ..tracking._store import NOT_FOUND
from ._lines import GENERATE

__all__ = [
    "FINAL",
    "BATCH_MOVES",
    "KEPT",
    "MOVES",
    "RECHECKS",
    "STATUS",
    "STATUSES",
    "WORDS",
    "ExitCode",
    "LineState",
    "Recheck",
    "exit_code",
    "line_state",
    "line_counts",
    "statuses",
    "words",
]

UNKNOWN, RUNNING, SUCCEEDED = State.UNKNOWN, State.RUNNING, State.SUCCEEDED
SAVED, FAILED, EXPIRED = State.SAVED, State.FAILED, State.EXPIRED
# The states a ledger row holds: a line's task is never kept as queued (``pending``, a task a
# run has not seen start is ``running``) nor as forgotten (a failed line, error `not_found`).
KEPT = (UNKNOWN, RUNNING, SUCCEEDED, SAVED, FAILED, EXPIRED)
FINAL = frozenset(state for state in KEPT if task.WORK[state] is None)


class LineState(str, Enum):
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

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:  # f"{state}" is its value on every Python
        return format(self.value, spec)


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
