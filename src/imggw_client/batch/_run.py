"""A run's lines as they move (:class:`RunLines`): every state change held to
``_states.MOVES``, the counts and money that progress and the report show, the room their
results take, and what a failure means for a line: tried again later in this run, left where it
stands for the next run (with its key), or the end of the run.

What was paid for is never lost to this run's own limits: a line with a task id fails only when
its task failed (or its result expired, or the gateway says it does not know the task); any
other error leaves it where it stands for the next run. The tracker's loop (``tracking/_loop``)
moves the lines through the batch's store (``_ledger_store``), which keeps them here; a run's
time, retries and end are the tracker's ``Course``, which ``RunLines`` extends.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from .._core.states import State
from .._core.surfaces import safe_message
from ..tracking._store import FATAL, Course, retry_later
from ._ledger import Ledger, Totals
from ._schema import Row
from ._states import FAILED, FINAL, MOVES, RUNNING, SUCCEEDED, line_state

__all__ = ["FATAL", "RunLines", "retry_later"]

log = logging.getLogger("imggw_client")
UNEXPECTED_LOGGED = 20  # faults no rule covers, logged one by one; the rest are counted
LEFT_LOGGED = 20  # lines left for the next run (a query error, the line timeout) logged one by one


class Amount(Protocol):
    """What a line was charged (a ``Charge`` of the admission): credits and cost, None when
    not stated."""

    @property
    def credits(self) -> float | None: ...

    @property
    def cost(self) -> float | None: ...


class Mover(Protocol):
    """Told of each move before it is made (the room a run's results take)."""

    def moved(self, row: Row, state: State) -> None: ...


def _unknown_cost(charge: Amount) -> int:
    """1 for a line charged in credits with no cost stated (as ``Totals.cost_unknown``)."""
    return int(charge.credits is not None and charge.cost is None)


class RunLines(Course):
    """The lines of one run over a planned ledger: their counts and money (from ``totals``,
    then kept up to date), their moves, and the run's end (``fatal``, ``cancel``) or the end of
    its submits (``stopped``, and the guard that stopped them: ``stopped_by``).
    """

    def __init__(
        self,
        ledger: Ledger,
        totals: Totals,
        room: Mover,
        *,
        deadline: float,
        line_timeout: float | None,
        redact: Callable[[str], str],
    ) -> None:
        super().__init__(deadline=deadline, line_timeout=line_timeout, redact=redact)
        self.ledger = ledger
        self.room = room
        self.counts: Counter[State] = totals.counts
        self.credits, self.cost = totals.credits, totals.cost
        self.cost_unknown = totals.cost_unknown
        self.total = sum(self.counts.values())
        self.started = time.monotonic()
        self.finished_here = 0
        self.unexpected = 0
        self.left = 0  # lines left for the next run by a query error or the line timeout
        # Progress, told after each move and at once (True) when submits stop; the run's
        # progress reads the loop's download queue, so it is made after the loop, and this run.
        self.tell: Callable[[bool], None] = lambda at_once: None

    # ------------------------------------------------------------------------ moves

    def move(self, row: Row, state: State, *, at_once: bool = False) -> None:
        """Moves the row to ``state`` (one of the moves ``_states.MOVES`` allows), keeps the
        counts, and queues the row for the ledger (``at_once``: writes it now, in this thread,
        before a run begins)."""
        if state not in MOVES[row.state]:
            raise AssertionError(
                f"line {row.line}: no move from {row.state.value} to {state.value}"
            )
        self.counts[row.state] -= 1
        self.counts[state] += 1
        self.room.moved(row, state)
        row.state = state
        now = time.time()
        if state is SUCCEEDED and row.completed_at is None:
            row.completed_at = now
        if state in FINAL:
            self.finished_here += 1
            row.finished_at = now
        if at_once:
            self.ledger.save_now(row)
            return
        self.ledger.save(row)
        self.tell(False)

    def fail(self, row: Row, code: str, message: str) -> None:
        """The line failed, with ``code`` and ``message`` kept for its manifest row."""
        row.error_code, row.error_message = code, message
        self.move(row, FAILED)

    def charged(self, before: Amount, now: Amount) -> None:
        """A line's charge went from ``before`` to ``now``: the run's money follows."""
        self.credits += (now.credits or 0) - (before.credits or 0)
        self.cost += (now.cost or 0) - (before.cost or 0)
        self.cost_unknown += _unknown_cost(now) - _unknown_cost(before)

    @property
    def unsaved(self) -> int:
        """Lines whose results are still to be saved: running, or succeeded and not saved."""
        return self.counts.get(RUNNING, 0) + self.counts.get(SUCCEEDED, 0)

    # ------------------------------------------------------------------------ failures

    def unexpected_fault(self, row: Row, exc: Exception) -> None:
        """A fault no rule covers (a bug here or beneath): one line's step, not the run. The
        line keeps the state last saved, so the next run takes it up again, with its key."""
        self.unexpected += 1
        if self.unexpected > UNEXPECTED_LOGGED:
            return
        frame = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" at {Path(frame[0].filename).name}:{frame[0].lineno}" if frame else ""
        # Only the type, place and a cleaned message: an exception's text may quote a header.
        log.error(
            "line %d: unexpected %s%s: %s; the line stays unfinished for the next run%s",
            row.line,
            type(exc).__name__,
            where,
            safe_message(self.redact(str(exc))) or "",
            "; later ones are counted, not logged" if self.unexpected == UNEXPECTED_LOGGED else "",
        )

    def left_for_next_run(self, row: Row, why: str) -> None:
        """The line keeps its state (and its key) for the next run, which takes it up again:
        said in the log, one by one for the first few."""
        self.left += 1
        if self.left <= LEFT_LOGGED:
            log.warning(
                "line %d (task %s): %s; it stays %s for the next run%s",
                row.line,
                row.task_id,
                why,
                line_state(row.state),
                "; later ones are counted, not logged" if self.left == LEFT_LOGGED else "",
            )
