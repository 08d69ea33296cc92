"""The SDK's operations on a task as generators over actions: the whole logic of submit, get,
wait and generate (and the entry to downloads), with no I/O.

A flow yields :mod:`~imggw_client._core.wire` actions (``Send``, ``Sleep``, ``Notify``,
``Fetch``); a driver performs each and sends the outcome back; the flow's return value is the
operation's result, and its exceptions are the operation's errors. ``Client`` and
``AsyncClient`` differ only in how they perform actions, so every decision here is made once,
and tests drive a flow with a fake clock and never sleep. Requests go out through
:mod:`~imggw_client._core.attempts`; results come in through :mod:`~imggw_client._core.downloads`.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from . import reasons, rules, states, surfaces
from .attempts import Attempts, classify
from .budget import QUERY, SUBMIT, Budget, RemoteBudget
from .config import Settings, Surface, check_surface
from .downloads import Results
from .durations import DurationModel
from .exceptions import (
    ImggwError,
    NotFoundError,
    TaskFailedError,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from .interruptions import carry_key, carry_task, is_interruption
from .models import DownloadedFile, ImageRequest, Submission, Task, TaskStatus, raise_violations
from .poll import WaitSchedule, plan_wait, query_priority
from .wire import (
    PHASE,
    POLL,
    TASK_DONE,
    Answered,
    Flow,
    Notify,
    Observe,
    Record,
    Reply,
    Send,
    Sleep,
    TransportFailure,
    WireRequest,
)

log = logging.getLogger("imggw_client")

FINAL_QUERY_LEAD = 1.0  # the last query of a wait goes out this long before its deadline (at most)


def new_idempotency_key() -> str:
    """A fresh key: 128 random bits, as 32 hex characters."""
    return os.urandom(16).hex()  # what secrets.token_hex(16) is, without its two calls


class Flows(Attempts):
    """Builds the flows of one client, over :class:`Attempts` (its settings, clocks, jitter and
    request budget). ``durations`` is what the client learned of how long its tasks take
    (DESIGN 15), shared with its ``with_options`` copies as the budget is."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        budget: Budget | RemoteBudget | None = None,
        durations: DurationModel | None = None,
    ) -> None:
        super().__init__(settings, clock=clock, wall=wall, rng=rng, budget=budget)
        self.durations = durations if durations is not None else DurationModel()
        self._secrets = (settings.api_key,)
        # Whether flows yield Record actions (DESIGN 19): set by a client that keeps a journal.
        self.journaled = False

    def surface(self, surface: str | None) -> Surface:
        """The call's surface, checked; the client's when None."""
        return self.settings.surface if surface is None else check_surface(surface)

    # ------------------------------------------------------------------------ operations

    def submit(
        self,
        prompt: str,
        *,
        aspect_ratio: rules.AspectRatio,
        resolution: rules.Resolution,
        surface: str | None,
        idempotency_key: str | None,
        validate: bool = True,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Flow[Submission]:
        """Submits one logical request; every retry carries the same idempotency key."""
        surface = self.surface(surface)
        extra = _checked_headers(extra_headers)
        if validate:
            request = ImageRequest(prompt, aspect_ratio, resolution)
        else:
            request = ImageRequest.unchecked(prompt, aspect_ratio, resolution)
        if idempotency_key is None:
            key = new_idempotency_key()
        else:
            raise_violations(rules.check_idempotency_key(idempotency_key))
            key = idempotency_key
        return self._submit(
            request, surface, key, validate, chosen=idempotency_key is not None, extra=extra
        )

    def resubmit(
        self,
        err: UnknownOutcomeError,
        *,
        surface: str | None = None,
        idempotency_key: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Flow[Submission]:
        """Sends the submit of an :class:`UnknownOutcomeError` again: its request, key and
        surface, so the gateway replays the task the first one may have made. ``surface`` and
        ``idempotency_key``, if given, must be the error's own: another would bill anew."""
        extra = _checked_headers(extra_headers)
        asked = (
            ("surface", surface, err.surface),
            ("idempotency_key", idempotency_key, err.idempotency_key),
        )
        for name, given, own in asked:
            if given is not None and given != own:
                rule = f"must be the error's own ({own!r}) to resend its submit, or left out"
                raise_violations([rules.Violation(name, rule, reasons.INVALID_REQUEST.code)])
        # The request is sent as it was built (checked or not): the same bytes, so a replay.
        surface = self.surface(err.surface)
        return self._submit(
            err.request, surface, err.idempotency_key, False, chosen=True, extra=extra
        )

    def _submit(
        self,
        request: ImageRequest,
        surface: Surface,
        key: str,
        validate: bool,
        *,
        chosen: bool,
        extra: Mapping[str, str] | None = None,
    ) -> Flow[Submission]:
        """``chosen``: the caller gave the key (and so holds it already)."""
        wire = self._headed(surfaces.build_submit(surface, request, key, validate=validate), extra)
        secrets = (*self._secrets, request.prompt)
        # Whether a task may exist for this key: a request in flight, or one whose failure
        # left its outcome unknown, or an answer read. An interruption then names the key.
        in_flight = may_exist = False
        # Whether any request of this call may have reached the gateway: one that surely never
        # left (a refused connection) is no request at all.
        left = False

        def send() -> Send:
            nonlocal in_flight
            in_flight = True
            return Send(wire, self.settings.timeout)

        def read(outcome: Reply | TransportFailure) -> Submission:
            nonlocal in_flight, may_exist, left
            in_flight = False
            left = left or not (isinstance(outcome, TransportFailure) and not outcome.sent)
            try:
                submission = surfaces.read_submit(
                    surface,
                    outcome,
                    key,
                    self.wall(),
                    secrets,
                    resolution=request.resolution,
                    request=request,  # what it was made from
                )
            except NotFoundError as err:
                url = self.settings.base_url + wire.path
                raise surfaces.no_submit_route(surface, url, err) from err
            except ImggwError as err:
                may_exist = may_exist or classify(err).unknown
                raise
            may_exist = True
            return submission

        def give_up(err: ImggwError, unknown: bool) -> ImggwError:
            if not unknown:
                return err
            return UnknownOutcomeError(
                f"the submit's outcome is unknown ({err.message}); resubmit with "
                f"idempotency_key={key!r} to resume it without creating a second task",
                idempotency_key=key,
                request=request,
                surface=surface,
                status_code=err.status_code,
                code=err.code,
            )

        def stamped() -> Flow[Submission]:
            # This call's name in the journal: the row it makes is the one its refusal removes.
            attempt = new_idempotency_key() if self.journaled else ""
            if self.journaled:  # on disk before the request leaves: a crash cannot lose it
                yield Record(states.Sending(key, surface, request, attempt))
            try:
                submission = yield from self.attempts(send, read, give_up, kind=SUBMIT)
            except BaseException as exc:
                if (in_flight or may_exist) and is_interruption(exc):
                    carry_key(exc, request, surface, key, chosen=chosen)
                elif self.journaled and _refused(exc, may_exist):
                    yield Record(states.Refused(key, surface, attempt))
                elif self.journaled and not (left or in_flight) and isinstance(exc, Exception):
                    yield Record(states.NotSent(key, surface, attempt))  # the gateway saw nothing
                raise
            submission._accepted_at = self.clock()
            if self.journaled:
                yield Record(states.Accepted(submission))
            return submission

        return stamped()

    def get(
        self, task_id: str, *, surface: str | None, extra_headers: Mapping[str, str] | None = None
    ) -> Flow[Task]:
        """One query (retried on transient failures)."""
        surface, task_id = self.surface(surface), _checked_task_id(task_id)
        wire = self._headed(surfaces.build_query(surface, task_id), _checked_headers(extra_headers))
        flow = self.attempts(
            lambda: Send(wire, self.settings.timeout),
            self._task_reader(surface, task_id),
            kind=QUERY,
        )
        return self._seen(flow) if self.journaled else flow

    def _seen(self, flow: Flow[Task]) -> Flow[Task]:
        task = yield from flow
        yield Record(states.Seen(task))
        return task

    def saved(self, task: Task, files: list[DownloadedFile]) -> Flow[None]:
        """Tells the journal (if any) that ``task``'s results are saved as ``files``."""
        if self.journaled and files:
            paths = tuple(f.path for f in files)
            yield Record(states.Saved(task.id, task.surface, paths))

    def expired(self, task: Task) -> Flow[None]:
        """Tells the journal (if any) that ``task``'s links died unsaved."""
        if self.journaled:
            yield Record(states.Expired(task.id, task.surface))

    def wait(
        self,
        task: str | Submission | Task | WaitTimeoutError,
        *,
        surface: str | None,
        timeout: float,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Flow[Task]:
        """Polls until the task is terminal or ``timeout`` seconds pass. Never submits. A wait
        on a :class:`Submission` knows its task's kind and start, and so can learn; one on a
        :class:`WaitTimeoutError` waits on what that wait was given, on its surface. The tasks
        it returns carry the request and key it was given (a submission's, a task's)."""
        now = self.clock()
        started = accepted = kind = None
        extra = _checked_headers(extra_headers)
        origin: dict[str, Any] = {}
        if isinstance(task, UnknownOutcomeError):
            rule = "an UnknownOutcomeError names no task: resend it with submit(err), then wait"
            raise_violations([rules.Violation("task", rule, reasons.INVALID_REQUEST.code)])
        if isinstance(task, WaitTimeoutError):
            surface = task.surface or surface
            origin = _origin(task.last_task)
            task = task.submission if task.submission is not None else task.task_id
        submission = task if isinstance(task, Submission) else None
        if isinstance(task, Submission):
            origin = _origin(task)
            task_id, surface = task.task_id, task.surface
            accepted = task._accepted_at
            if not task.replayed:  # a replayed task started earlier, when is not known
                started = accepted if accepted is not None else self._started(task.submitted_at)
            if task.resolution is not None:
                kind = (task.surface, task.resolution.lower())
        elif isinstance(task, Task):
            origin = _origin(task)
            task_id, surface = task.id, task.surface
        else:
            task_id = task
        surface, task_id = self.surface(surface), _checked_task_id(task_id)
        schedule = plan_wait(
            self.settings.poll,
            self.durations,
            kind,
            started=started,
            accepted=accepted,
            now=now,
            rng=self.rng,
        )
        return self._wait(
            surface,
            task_id,
            _checked_timeout(timeout),
            schedule,
            started,
            submission,
            extra,
            origin,
        )

    def _started(self, submitted_at: datetime | None) -> float | None:
        """A task's start on this process's monotonic clock, from the wall-clock time its
        submit was answered (None if unknown; never in the future)."""
        if submitted_at is None:
            return None
        try:
            ago = self.wall() - submitted_at.timestamp()
        except (OverflowError, OSError, ValueError):
            return None
        return self.clock() - ago if ago > 0 else self.clock()

    def _wait(
        self,
        surface: Surface,
        task_id: str,
        timeout: float,
        schedule: WaitSchedule,
        started: float | None = None,
        submission: Submission | None = None,
        extra: Mapping[str, str] | None = None,
        origin: Mapping[str, Any] | None = None,
    ) -> Flow[Task]:
        """Polls within ``timeout`` (0: checks once), its last query ``lead`` before the
        deadline; a timeout's error carries ``submission``, so waiting on it resumes this wait.
        Each task read gets ``origin``'s fields (its request and key)."""
        deadline = self.clock() + timeout
        bounded = timeout > 0
        # Fast poll policies (tests, demos) get a short lead, so short waits still poll.
        lead = min(FINAL_QUERY_LEAD, self.settings.timeout, self.settings.poll.initial_interval)
        wire = self._headed(surfaces.build_query(surface, task_id), extra)
        read_task = self._task_reader(surface, task_id)
        last: Task | None = None
        seen: tuple[TaskStatus, int | None] | None = None
        sent = hint = None

        def send() -> Send:
            nonlocal sent
            sent = self.clock()  # after the budget's slot: when the query really goes
            if not bounded:
                return Send(wire, self.settings.timeout)
            return Send(wire, min(self.settings.timeout, deadline - sent))

        def read(outcome: Reply | TransportFailure) -> Task:
            nonlocal hint
            answer = read_task(outcome)
            hint = surfaces.poll_hint(outcome, self.wall())
            return answer.model_copy(update=origin) if origin else answer

        def priority() -> float:
            # The query most likely to find its task finished takes the budget's next slot.
            now = self.clock()
            return now + query_priority(schedule.chance(now), 0.0, self.settings.poll.max_interval)

        def timed_out() -> WaitTimeoutError:
            return WaitTimeoutError(
                task_id, last, timeout=timeout, surface=surface, submission=submission
            )

        def give_up(err: ImggwError, unknown: bool) -> ImggwError:
            # Out of time while the gateway was unreachable: still not a failure of the task.
            if classify(err).retry:
                return timed_out()
            return err

        first = schedule.first_sleep(self.clock())
        if first > 0 and bounded and min(first, timeout - lead) > 0:
            yield Sleep(min(first, timeout - lead))
        while True:
            if self.observe:
                yield Observe(POLL, surface=surface, task_id=task_id)
            task = yield from self.attempts(
                send,
                read,
                give_up,
                kind=QUERY,
                deadline=deadline if bounded else None,
                priority=priority,
            )
            now = self.clock()
            if (task.status, task.progress) != seen:
                if self.journaled and (seen is None or seen[0] is not task.status):
                    yield Record(states.Seen(task))
                seen = (task.status, task.progress)
                yield Notify(task)
            last = task
            if task.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED) and self.observe:
                took = -1.0 if started is None else max(0.0, now - started)  # -1: not known
                yield Observe(
                    TASK_DONE,
                    value=took,
                    surface=surface,
                    task_id=task_id,
                    status=task.status.value,
                )
            if task.status is TaskStatus.SUCCEEDED:
                # Seen finished by the query sent at `sent`: a budget's or a slow answer's delay
                # before or after it says nothing of how long the task took.
                schedule.finished(sent if sent is not None else now)
                return task
            if task.status is TaskStatus.FAILED:
                raise TaskFailedError(task)
            remaining = deadline - now
            if not bounded or remaining <= lead:
                if bounded and remaining > 0:
                    yield Sleep(remaining)  # a wait that times out takes its whole timeout
                raise timed_out()
            # A poll the budget delayed was sent late: its interval counts from then.
            interval = schedule.active(sent if sent is not None else now, now, hint)
            yield Sleep(min(interval, remaining - lead))

    def generate(
        self,
        prompt: str,
        *,
        aspect_ratio: rules.AspectRatio,
        resolution: rules.Resolution,
        surface: str | None,
        idempotency_key: str | None,
        timeout: float,
        validate: bool = True,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Flow[Task]:
        """Submit, then wait. A slow task is waited on, never replaced by a new submission."""
        timeout = _checked_timeout(timeout)  # before the submit: a bad value must cost nothing
        extra = _checked_headers(extra_headers)
        if self.observe:
            yield Observe(PHASE, kind="submit")
        submission = yield from self.submit(
            prompt,
            aspect_ratio=aspect_ratio,
            resolution=resolution,
            surface=surface,
            idempotency_key=idempotency_key,
            validate=validate,
            extra_headers=extra,
        )
        try:
            yield Answered(submission)  # the caller's on_submit, before any wait
            if self.observe:
                yield Observe(PHASE, kind="wait", task_id=submission.task_id)
            return (
                yield from self.wait(submission, surface=None, timeout=timeout, extra_headers=extra)
            )
        except BaseException as exc:
            # Whatever ends it now (an interruption, a callback's error, a closed client, queries
            # that keep failing), the task goes on, billed, and the caller may never have seen
            # its id: name it. A task's failure and a wait's timeout carry it already.
            if not isinstance(exc, (GeneratorExit, TaskFailedError, WaitTimeoutError)):
                carry_task(exc, submission)
            raise

    def downloads(
        self,
        task: Task,
        dest_dir: Path,
        *,
        overwrite: bool,
        max_bytes: int,
        timeout: float | None = None,
        prefix: str = "",
    ) -> list[Flow[DownloadedFile]]:
        """One flow per result URL of a succeeded task, to run one after another or at once.
        ``timeout`` bounds each attempt at a file, from the request to the last byte (default:
        the client's timeout); ``prefix`` starts each file's name."""
        results = Results(self, task, self._requery)
        return results.files(
            dest_dir, overwrite=overwrite, max_bytes=max_bytes, timeout=timeout, prefix=prefix
        )

    def opened(
        self, task: Task, index: int, *, max_bytes: int, timeout: float | None = None
    ) -> Flow[BinaryIO]:
        """Result ``index`` of a succeeded task, fetched and verified exactly as a download
        is, into a stream the driver holds instead of a file: returned at its start, for the
        caller to read and close. Nothing is written where the caller would see it."""
        return Results(self, task, self._requery).opened(
            index, max_bytes=max_bytes, timeout=timeout
        )

    def _requery(self, task: Task) -> Flow[Task]:
        """The task asked for again: a dead result link's fresh one."""
        return self.get(task.id, surface=task.surface)

    # ------------------------------------------------------------------------ machinery

    def _headed(self, wire: WireRequest, extra: Mapping[str, str] | None) -> WireRequest:
        """``wire`` with the client's ``default_headers``, then the call's ``extra_headers``,
        each replacing a header of the same name in any case (the driver sets the key last)."""
        if not (self.settings.headers or extra):
            return wire
        added = [*self.settings.headers, *(extra or {}).items()]
        headers = dict(wire.headers or {})
        for name, value in added:
            for same in [have for have in headers if have.lower() == name.lower()]:
                del headers[same]
            headers[name] = value
        return replace(wire, headers=headers)

    def _task_reader(
        self, surface: Surface, task_id: str
    ) -> Callable[[Reply | TransportFailure], Task]:
        """Reads a query's outcome as the task ``task_id``."""

        def read(outcome: Reply | TransportFailure) -> Task:
            try:
                return surfaces.read_task(surface, outcome, task_id, self.wall(), self._secrets)
            except NotFoundError as err:
                err.task_id = task_id  # which task is unknown: one of many, in as_completed
                raise

        return read


def _origin(made: Submission | Task | None) -> dict[str, Any]:
    """What a task was made from, as its fields: the request and key ``made`` knows."""
    if made is None:
        return {}
    known = {"request": made.request, "idempotency_key": made.idempotency_key}
    return {name: value for name, value in known.items() if value is not None}


def _refused(exc: BaseException, may_exist: bool) -> bool:
    """Whether a submit's failure is the gateway's refusal, for good: an answer (a 4xx) that
    makes no task. Anything else (not sent, no answer, an unknown outcome) may have a task."""
    if may_exist or not isinstance(exc, ImggwError) or isinstance(exc, UnknownOutcomeError):
        return False
    status = exc.status_code
    return status is not None and 400 <= status < 500 and not classify(exc).unknown


def _checked_headers(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """A call's ``extra_headers``, checked before anything is sent."""
    if headers is not None:
        raise_violations(rules.check_headers(headers, "extra_headers"))
    return headers


def _checked_timeout(timeout: object) -> float:
    """A wait's ``timeout``, checked before anything is sent."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise_violations([rules.Violation("timeout", "must be seconds >= 0", "invalid_timeout")])
    assert isinstance(timeout, (int, float))
    return float(timeout)


def _checked_task_id(task_id: object) -> str:
    """A task id (an int is taken as its digits), checked before anything is sent."""
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    raise_violations(rules.check_task_id(task_id))
    assert isinstance(task_id, str)
    return task_id
