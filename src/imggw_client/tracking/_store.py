"""What the tracker's one run loop (``_loop``) stands on: a run's :class:`Course` (its time, its
retries, its end), and the two small protocols that tell a batch from a journal.

- A :class:`Store` keeps the items and their moves: the batch keeps its ledger's rows (through
  ``batch/_ledger_store.LedgerStore``), ``Tracker.collect`` a journal's unfinished tasks. The
  loop tells it where each item stands, in the states of ``_core/states.py``
  (``running``, ``succeeded``: its results to save, ``saved``, ``failed``, ``expired``); the
  store keeps them in its own words.
- :class:`Hooks` see what the loop does and may say no to a submit: the batch's guards and
  room, its charges, its gallery's pace; what a collect reports.

What an item is, is told by its own properties, never by a mode of the loop: an item with a
task id is waited on, never submitted; one this store submitted (``made_here``) is asked again
a few times when the gateway says it does not know its task (a task just made may not be
visible everywhere behind the gateway yet).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_random_exponential

from .._core.attempts import classify
from .._core.downloads import NOT_AN_IMAGE, RESULT_TOO_LARGE
from .._core.exceptions import (
    AuthenticationError,
    ConfigurationError,
    DownloadError,
    ImggwError,
    PermissionDeniedError,
    UnknownOutcomeError,
)
from .._core.models import DownloadedFile, Task
from .._core.states import State, Work
from .._core.surfaces import safe_message
from .._download import REDIRECT_REFUSED, WRITE_FAILED
from .._files import StorageError

__all__ = ["FATAL", "NOT_FOUND", "Course", "Hooks", "Item", "Store", "retry_later"]

NOT_FOUND = "not_found"  # an item failed: the gateway does not know its task (manifests say so)

# Failures that doom every item alike: the run stops, and its unfinished items wait for a rerun
# (a submit answered 404, a base URL with a wrong path, is a ConfigurationError: nothing was
# made, nothing billed, and the same command with the right URL resumes every item).
FATAL = (AuthenticationError, PermissionDeniedError, ConfigurationError, StorageError)
RETRY_PAUSE = (0.5, 10.0)  # first and longest pause before an item's step is tried again
# Downloads that another try in this run would not mend (a rerun looks at a document's link
# again: what a proxy served today may be the image tomorrow).
_FINAL_DOWNLOAD_CODES = frozenset({RESULT_TOO_LARGE, WRITE_FAILED, NOT_AN_IMAGE, REDIRECT_REFUSED})


def retry_later(err: BaseException) -> bool:
    """A failure after which an item is tried again later instead of failing: what the core
    retries, and an unknown submit outcome (the item's key makes another try safe).
    """
    if not isinstance(err, ImggwError) or isinstance(err, FATAL):
        return False
    if isinstance(err, DownloadError) and err.code in _FINAL_DOWNLOAD_CODES:
        return False
    return isinstance(err, (UnknownOutcomeError, DownloadError)) or classify(err).retry


class Course:
    """The time and the end of one run of the loop: its ``deadline`` (``time.monotonic()``),
    how long one item's step may take (``line_timeout``, None: no limit), a failure that ends
    it (``fatal``, which cancels ``cancel``), and the end of its submits (``stopped``, by
    ``stopped_by`` for ``stop_reason``: a guard, the credits, the disk).
    """

    def __init__(
        self, *, deadline: float, line_timeout: float | None, redact: Callable[[str], str]
    ) -> None:
        self.deadline = deadline
        self.line_timeout = line_timeout
        self.redact = redact
        self.fatal: ImggwError | None = None
        self.cancel = anyio.CancelScope()
        self.stopped = False  # no more submits in this run (a guard, a 402, the disk) ...
        self.stopped_by: str | None = None  # ... this guard, having seen this
        self.stop_reason = ""
        # Keys of unknown submits first sent longer ago than the gateway remembers keys: not
        # sent again by this run (a second task could be billed), left where they stand.
        self.stale_keys: list[str] = []

    def stop(self, err: ImggwError) -> None:
        """A failure that ends the run (one of :data:`FATAL`): every step is cancelled."""
        self.fatal = self.fatal or err
        self.cancel.cancel()

    def why(self, err: ImggwError) -> str:
        """What an error says of itself in the log: its code, else its cleaned message."""
        return err.code or safe_message(self.redact(err.message)) or type(err).__name__

    def remaining(self) -> float:
        """Seconds left before the run's deadline (negative once it passed)."""
        return self.deadline - time.monotonic()

    def line_deadline(self) -> float:
        """When an item's step begun now gives up for this run: ``line_timeout`` from now, or
        the run's deadline if sooner."""
        limit = self.line_timeout
        return self.deadline if limit is None else min(self.deadline, time.monotonic() + limit)

    def out_of_time(self, until: float) -> Callable[[RetryCallState], bool]:
        """A tenacity stop: the run ends (a failure that ends it), or ``until`` comes, before
        the next try would go."""

        def stop(state: RetryCallState) -> bool:
            left = until - time.monotonic()
            return self.fatal is not None or (state.upcoming_sleep or 0) >= left

        return stop

    def retrying(self, until: float) -> AsyncRetrying:
        """An item's step tried again after failures worth waiting out, until ``until`` (or a
        failure that ends the run)."""
        return AsyncRetrying(
            retry=retry_if_exception(retry_later),
            wait=wait_random_exponential(multiplier=RETRY_PAUSE[0], max=RETRY_PAUSE[1]),
            stop=self.out_of_time(until),
            reraise=True,
        )


class Item(Protocol):
    """One task the loop runs: what it asks for (``fields``: ``prompt``, ``aspect_ratio``,
    ``resolution``), its key, its task and its results' links as they are learned. ``line``
    orders a store's items (the loop asks for those after the last it was given).

    An item may also carry ``first_sent`` (Unix seconds: when its submit first left, as a
    journal row knows it; an unknown submit older than the client's ``idempotency_window`` is
    then never sent again by the loop) and ``validate`` (False: its submit is sent again as it
    was first sent, unchecked, the same bytes)."""

    line: int
    surface: str
    fields: dict[str, Any]
    idempotency_key: str | None
    task_id: str | None
    submitted_at: float | None  # its submit was answered (Unix seconds; None: a replay)
    urls: list[str]
    expires_at: float | None

    @property
    def made_here(self) -> bool:
        """Submitted by this store (False: a task made elsewhere, named by its id)."""
        ...


ItemT = TypeVar("ItemT", bound=Item)
ItemT_contra = TypeVar("ItemT_contra", bound=Item, contravariant=True)


class Store(Protocol[ItemT]):
    """Where the items of a run are kept, and their moves (see the module's docstring). The
    loop calls :meth:`chunk` in a worker thread; every other method on the event loop."""

    def chunk(self, after: int) -> Sequence[ItemT]:
        """The next items to run, in order, after the one whose ``line`` is ``after`` (``[]``:
        none left). Blocking."""
        ...

    def work(self, item: ItemT) -> Work | None:
        """What the item needs now: its submit (with its key), a wait, its download, or
        nothing (final)."""
        ...

    def sending(self, item: ItemT) -> None:
        """The item's submit is about to leave (for the first time, or again): a store that
        keeps when its items first left (``first_sent``) records it now if it has not."""
        ...

    def reached(self, item: ItemT, state: State) -> None:
        """The item reached ``state`` (``running``, ``succeeded``, ``saved``)."""
        ...

    def fail(self, item: ItemT, code: str, message: str) -> None:
        """The item failed (a refused submit, a failed task, an unknown task, a bad result)."""
        ...

    def expire(self, item: ItemT, message: str) -> None:
        """The item's results were gone before they could be saved."""
        ...

    def left_for_next_run(self, item: ItemT, why: str) -> None:
        """The item keeps where it stands (and its key) for a later run."""
        ...

    def unexpected_fault(self, item: ItemT, exc: Exception) -> None:
        """A fault no rule covers ended the item's step: it keeps its last saved state."""
        ...

    def landing(self, item: ItemT) -> Path:
        """The folder the item's results are downloaded into."""
        ...

    def prefix(self, item: ItemT) -> str:
        """What the names of the item's files start with."""
        ...

    async def keep(self, item: ItemT, files: list[DownloadedFile]) -> None:
        """The item's results are downloaded and verified: put them where they belong and
        remember them (the item then reaches ``saved``)."""
        ...


class Hooks(Protocol[ItemT_contra]):
    """What the loop tells, and asks, the run's owner (see the module's docstring)."""

    def admit(self, item: ItemT_contra) -> AbstractAsyncContextManager[bool]:
        """Entered before an item's submit, left once it was answered: False says no (the
        item waits for a rerun, with its key)."""
        ...

    def working(self, item: ItemT_contra) -> AbstractContextManager[None]:
        """Held while an item past its submit is in this run's hands (waited on, downloaded)."""
        ...

    async def unsent(self, item: ItemT_contra, err: ImggwError | None) -> None:
        """An admitted submit made nothing: not sent (``err`` None: the run stopped meanwhile),
        or refused (``err``; an ``InsufficientCreditsError`` ends the run's submits)."""
        ...

    async def charged(self, item: ItemT_contra, task: Task, *, final: bool) -> None:
        """An answer about the item's task, which may state its charge (``final``: the task
        ended)."""
        ...

    async def ended(self, item: ItemT_contra, task: Task) -> None:
        """The item's task is terminal (succeeded or failed), before its results are saved."""
        ...

    async def saved(self, item: ItemT_contra) -> None:
        """The item's results are saved."""
        ...


def in_order(items: Sequence[ItemT], after: int) -> list[ItemT]:
    """The items whose ``line`` comes after ``after``, in order (a store held in memory)."""
    return sorted((item for item in items if item.line > after), key=lambda item: item.line)
