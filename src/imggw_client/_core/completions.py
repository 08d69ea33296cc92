"""Many waits in one driver, with no I/O: which flow acts next (DESIGN 19, ``as_completed``).

Each wait is a flow, as a single ``wait`` is. Here their sleeps are kept in one heap, so that
a driver with one thread (``Client``) or one task (``AsyncClient``) runs thousands of waits:
it asks :meth:`Completions.due` what to do, performs the actions it is given (all at once, the
queries of every wait due now), hands the outcomes back with :meth:`Completions.give`, and
collects the tasks that finished. The waits share the client's budget and what it learned of
its tasks' durations, as separate waits do.

Recovery is per task (DESIGN 22): a wait that ends on an error of its own task's (the gateway
no longer knows it, its query was refused) ends that task only, which is handed out as failed
with that error; only an error of the whole client (its key refused, the client closed, its
configuration) ends every wait. ``yield_errors=False`` keeps the older rule: the first wait
that fails other than by its task failing ends them all.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .config import check_surface
from .exceptions import (
    AuthenticationError,
    ClientClosedError,
    ConfigurationError,
    ImggwError,
    TaskFailedError,
    WaitTimeoutError,
)
from .models import Submission, Task, TaskError, TaskStatus
from .text import printable
from .wire import Action, Notify, Sleep

__all__ = ["Completions", "stand_in"]

Flow = Any  # Generator[Action, Any, Task]: a wait
log = logging.getLogger("imggw_client")

# Errors of the whole client, not of one task: every other wait would end on them too.
CLIENT_ERRORS = (AuthenticationError, ClientClosedError, ConfigurationError)
# A task's error with no code of its own (a gateway that names none): what its failure says.
QUERY_REFUSED = "query_refused"


def stand_in(item: Submission | Task | str, surface: str) -> Task:
    """What is known of a wait's task before any answer: its id, surface, request and key
    (a bare id is on ``surface``). What a task that ends on an error of its own is made from.
    """
    if isinstance(item, Task):
        made: Submission | Task | None = item
        task_id, surface = item.id, item.surface
    elif isinstance(item, Submission):
        made, task_id, surface = item, item.task_id, item.surface
    else:
        made, task_id = None, str(item)
    return Task(
        id=task_id,
        surface=check_surface(surface),
        status=TaskStatus.PENDING,
        request=None if made is None else made.request,
        idempotency_key=None if made is None else made.idempotency_key,
    )


class Completions:
    """The waits of one ``as_completed`` call (see the module's docstring). ``known`` holds
    each flow's :func:`stand_in`, in the flows' order: with it (and ``yield_errors``), a wait
    that ends on its own task's error hands out that task as failed."""

    def __init__(
        self,
        flows: Iterable[Flow],
        clock: Callable[[], float],
        *,
        known: Sequence[Task] = (),
        yield_errors: bool = True,
    ) -> None:
        self._clock = clock
        self._flows: dict[int, Flow] = dict(enumerate(flows))
        self._known = known
        self._yield_errors = yield_errors
        self._sleeping: list[tuple[float, int, int]] = []  # (wake at, order, flow)
        self._order = itertools.count()
        self._ready: list[tuple[int, Action]] = []
        self._done: deque[Task] = deque()
        # Each wait's failed task as its flow told it (Notify), record and all: the
        # TaskFailedError the flow then raises keeps it without (``raw`` emptied), and a failed
        # task is handed out as a succeeded one is.
        self._failed: dict[int, Task] = {}
        self._timed_out: list[WaitTimeoutError] = []
        self._error: ImggwError | None = None
        for index in list(self._flows):
            self._advance(index, None)

    def due(self) -> list[tuple[int, Action]] | float | None:
        """The actions to perform now (each with its flow's index), else the seconds until the
        next flow wakes; None when every flow ended (or one failed: see :meth:`error`)."""
        while not self._ready:
            if self._error is not None or not self._flows:
                return None
            if not self._sleeping:  # pragma: no cover - every live flow sleeps or acts
                return None
            wake, _, _ = self._sleeping[0]
            now = self._clock()
            if wake > now:
                return wake - now
            while self._sleeping and self._sleeping[0][0] <= now:
                _, _, index = heapq.heappop(self._sleeping)
                self._advance(index, None)
        ready, self._ready = self._ready, []
        return ready

    def give(self, outcomes: Iterable[tuple[int, Any]]) -> None:
        """Each performed action's outcome, back to its flow."""
        for index, outcome in outcomes:
            self._advance(index, outcome)

    def finished(self) -> list[Task]:
        """The tasks that became terminal since the last call, in the order they did."""
        tasks = list(self._done)
        self._done.clear()
        return tasks

    def error(self) -> ImggwError | None:
        """What ended the whole call: the first wait that failed on an error of the whole
        client (a key refused; with ``yield_errors=False``, any error but its task's failure),
        else, once every other wait ended, a
        :class:`WaitTimeoutError` whose message names the tasks still running and whose
        ``still_running`` holds every one's id (the first one's own fields kept)."""
        if self._error is not None:
            return self._error
        if self._flows or not self._timed_out:
            return None
        first = self._timed_out[0]
        return WaitTimeoutError(
            first.task_id,
            first.last_task,
            timeout=first.timeout,
            surface=first.surface,
            submission=first.submission,
            still_running=[err.task_id for err in self._timed_out],
        )

    def close(self) -> None:
        """Closes every flow still open (each gives back its budget places)."""
        flows, self._flows = self._flows, {}
        for flow in flows.values():
            flow.close()

    def _advance(self, index: int, outcome: Any) -> None:
        flow = self._flows[index]
        try:
            action = flow.send(outcome)
        except StopIteration as stop:
            self._end(index)
            self._done.append(stop.value)
            return
        except TaskFailedError as err:  # a finished task: it is yielded, as a success is
            task = self._failed.get(index)
            self._end(index)
            self._done.append(task if task is not None and task.id == err.task.id else err.task)
            return
        except WaitTimeoutError as err:
            self._end(index)
            self._timed_out.append(err)
            return
        except ImggwError as err:
            self._end(index)
            if (
                self._yield_errors
                and index < len(self._known)
                and not isinstance(err, CLIENT_ERRORS)
            ):
                self._done.append(_reported(self._known[index], err))
            elif self._error is None:
                self._error = err
            return
        if isinstance(action, Sleep):
            heapq.heappush(
                self._sleeping, (self._clock() + action.seconds, next(self._order), index)
            )
        else:
            if isinstance(action, Notify) and action.task.status is TaskStatus.FAILED:
                self._failed[index] = action.task
            self._ready.append((index, action))

    def _end(self, index: int) -> None:
        del self._flows[index]
        self._failed.pop(index, None)


def _reported(known: Task, err: ImggwError) -> Task:
    """The outcome of a task whose wait ended on ``err``, an error of its own: failed, with
    the error's code and message, and nothing the gateway said (``raw`` empty). Said once in
    a WARNING with its id and key (never the API key)."""
    code = err.code or QUERY_REFUSED
    key = printable(known.idempotency_key, 255) if known.idempotency_key else "not known"
    said = f"{err.message} ({code})"
    log.warning(
        "task %s (surface %s, idempotency key %s) ended without a result: %s; the other tasks "
        "go on",
        printable(known.id, 80),
        known.surface,
        key,
        said,
    )
    return known.model_copy(
        update={"status": TaskStatus.FAILED, "error": TaskError(code=code, message=err.message)}
    )
