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

A run only moves lines forward (:data:`MOVES`). Planning a rerun moves some back, at no cost
(:data:`RECHECKS`, carried out by the ledger): a look again costs a query or a download, never
a submit.

One word per line state outside the ledger (the manifest's ``status``, ``imggw batch
status``, the gallery): what the line delivered (:data:`STATUS`). ``succeeded`` is a line whose
files are saved; a line whose task succeeded but whose files are not saved yet is ``running``;
a line whose results expired is ``failed`` (error ``result_expired``). The display alone splits
``running`` in two (:data:`WORDS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

__all__ = [
    "FINAL",
    "LEGACY",
    "MOVES",
    "RECHECKS",
    "STATUS",
    "STATUSES",
    "WORDS",
    "ExitCode",
    "LineState",
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

# The moves a run makes. A line saved whose files are later missing or damaged is downloaded
# again (saved -> downloading), found when a run begins.
MOVES: Mapping[LineState, frozenset[LineState]] = {
    PENDING: frozenset({RUNNING, FAILED}),
    RUNNING: frozenset({DOWNLOADING, FAILED}),
    DOWNLOADING: frozenset({SAVED, FAILED, EXPIRED}),
    SAVED: frozenset({DOWNLOADING}),
    FAILED: frozenset(),
    EXPIRED: frozenset(),
}

# The moves back a plan makes (the ledger's ``recheck``), each for what a second look may find
# otherwise at no cost: (from, what the line must carry, to).
RECHECKS: tuple[tuple[LineState, str, LineState], ...] = (
    # links that died or a document served in place of an image: ask for fresh links
    (EXPIRED, "a task id", DOWNLOADING),
    (FAILED, "a task id and result links", DOWNLOADING),
    # a task the gateway did not know (a replica behind): ask again
    (FAILED, "a task id and the error not_found", RUNNING),
    # a submit answered 404 (a wrong base URL): nothing was made, its key submits it now
    (FAILED, "no task id and the error not_found", PENDING),
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
