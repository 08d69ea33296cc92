"""A paid task's life as the journal keeps it: its states, the events that move it, and the one
table that decides each move (DESIGN 19).

The table is executed, not asserted: :func:`move` is how a journal finds a task's next state,
and what is left to do for a task (:data:`WORK`) is read off the same states. A move the table
does not hold is ignored (the task keeps its state): a gateway that reports ``running`` after
``succeeded``, or an answer that arrives after the result was saved, changes nothing.

Adding a state takes a row here (its moves and its :data:`WORK`); the journal stores the name.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path

from .models import ImageRequest, Submission, Task, TaskStatus

__all__ = [
    "MOVES",
    "WORK",
    "Accepted",
    "Event",
    "Expired",
    "NotFound",
    "NotSent",
    "Refused",
    "Saved",
    "Seen",
    "Sending",
    "State",
    "Work",
    "event_of",
    "move",
]


class State(str, Enum):
    """Where a journaled task stands. ``unknown``: its submit left and no answer was read (a
    task may exist: it is sent again with its key, a replay). ``saved``: succeeded and its
    results are on disk; ``expired``: succeeded, its links died before they were saved;
    ``not_found``: the gateway no longer knows the task (asked again a few times first)."""

    UNKNOWN = "unknown"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    SAVED = "saved"
    FAILED = "failed"
    EXPIRED = "expired"
    NOT_FOUND = "not_found"


class Event(str, Enum):
    """What happened to a task, as the client saw it."""

    SENT = "sent"  # its submit is about to leave (the row is made)
    REFUSED = "refused"  # the gateway refused the submit: no task exists (the row goes)
    NOT_SENT = "not_sent"  # the submit surely never left: no task exists (the row goes)
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SAVED = "saved"
    EXPIRED = "expired"
    NOT_FOUND = "not_found"  # the gateway does not know the task (after a few asks)


class Work(str, Enum):
    """What a task still needs."""

    RESEND = "resend"  # the submit again, with its key: the gateway replays its task
    WAIT = "wait"
    DOWNLOAD = "download"


_ALIVE = (State.UNKNOWN, State.PENDING, State.RUNNING)
_STATUS_EVENTS = {
    Event.PENDING: State.PENDING,
    Event.RUNNING: State.RUNNING,
    Event.SUCCEEDED: State.SUCCEEDED,
    Event.FAILED: State.FAILED,
}

# (state, event) -> next state; None as a state: no row. The only table of moves.
MOVES: dict[tuple[State | None, Event], State | None] = {
    (None, Event.SENT): State.UNKNOWN,
    (State.UNKNOWN, Event.SENT): State.UNKNOWN,  # a resend keeps the row it had
    (State.UNKNOWN, Event.REFUSED): None,
    (State.UNKNOWN, Event.NOT_SENT): None,
    # A task's status moves forward only: pending -> running -> succeeded | failed.
    **{
        (state, event): target
        for state in _ALIVE
        for event, target in _STATUS_EVENTS.items()
        if not (state is State.RUNNING and target is State.PENDING)
    },
    (State.SUCCEEDED, Event.SUCCEEDED): State.SUCCEEDED,
    (State.SUCCEEDED, Event.SAVED): State.SAVED,
    (State.SUCCEEDED, Event.EXPIRED): State.EXPIRED,
    (State.SAVED, Event.SAVED): State.SAVED,  # saved again (elsewhere): the newer files
    (State.EXPIRED, Event.SAVED): State.SAVED,  # a refreshed link saved after all
    # A task the gateway forgot ends there: nothing more to ask (its results, if any, are gone).
    (State.PENDING, Event.NOT_FOUND): State.NOT_FOUND,
    (State.RUNNING, Event.NOT_FOUND): State.NOT_FOUND,
}

# What each state still needs; a state with no work is final for the journal.
WORK: dict[State, Work | None] = {
    State.UNKNOWN: Work.RESEND,
    State.PENDING: Work.WAIT,
    State.RUNNING: Work.WAIT,
    State.SUCCEEDED: Work.DOWNLOAD,
    State.SAVED: None,
    State.FAILED: None,
    State.EXPIRED: None,
    State.NOT_FOUND: None,
}


def move(state: State | None, event: Event) -> State | None:
    """The state after ``event``; the same state when the table holds no such move."""
    return MOVES.get((state, event), state)


def event_of(status: TaskStatus) -> Event:
    """The event of a status seen in an answer."""
    return Event(status.value)


# What a flow reports to the journal (through the driver's Record action). Pure data.


@dataclass(frozen=True, slots=True)
class Sending:
    """A submit is about to leave with ``key``: committed before the request is sent.
    ``attempt`` names this submit call: a row it made is the one its :class:`Refused` or
    :class:`NotSent` may remove (a row an earlier submit made may hold a paid task)."""

    key: str
    surface: str
    request: ImageRequest
    attempt: str = ""


@dataclass(frozen=True, slots=True)
class Accepted:
    """The submit was answered: the task's id and when."""

    submission: Submission


@dataclass(frozen=True, slots=True)
class Refused:
    """The submit was refused for good (a 4xx that makes no task)."""

    key: str
    surface: str
    attempt: str = ""


@dataclass(frozen=True, slots=True)
class NotSent:
    """The submit ended and no request of it ever left (a refused connection, no such host):
    the gateway saw nothing."""

    key: str
    surface: str
    attempt: str = ""


@dataclass(frozen=True, slots=True)
class Seen:
    """A query's answer: status, charge, link expiry."""

    task: Task


@dataclass(frozen=True, slots=True)
class Saved:
    """A task's results saved: the files' paths (or where the caller put them, as given)."""

    task_id: str
    surface: str
    files: tuple[str | Path, ...]


@dataclass(frozen=True, slots=True)
class Expired:
    """A task's result links died before they were saved."""

    task_id: str
    surface: str
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class NotFound:
    """The gateway does not know the task (after the caller's allowance of asks)."""

    task_id: str
    surface: str
