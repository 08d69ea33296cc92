"""The SDK's operations as generators over actions: the whole logic of submit, get, wait,
generate and download, with no I/O.

A flow yields :mod:`~imggw_client._core.wire` actions (``Send``, ``Sleep``, ``Notify``,
``Fetch``); a driver performs each and sends the outcome back; the flow's return value is the
operation's result, and its exceptions are the operation's errors. ``Client`` and
``AsyncClient`` differ only in how they perform actions, so every decision here is made once,
and tests drive a flow with a fake clock and never sleep.
"""

from __future__ import annotations

import logging
import random
import re
import secrets as _secrets
import shlex
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

from . import reasons, rules, states, surfaces
from .budget import QUERY, SUBMIT, Budget, RemoteBudget, Ticket
from .config import Settings, Surface, check_surface
from .durations import DurationModel
from .errors import add_note
from .exceptions import (
    APITimeoutError,
    AuthenticationError,
    DownloadError,
    ImggwError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ResultExpiredError,
    ServerError,
    TaskFailedError,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from .models import DownloadedFile, ImageRequest, Submission, Task, TaskStatus, raise_violations
from .poll import WaitSchedule, plan_wait, query_priority
from .retry import Verdict, backoff, classify, honour_retry_after, next_delay
from .text import link_origin, printable
from .wire import (
    BUDGET_WAIT,
    PHASE,
    POLL,
    REQUEST,
    TASK_DONE,
    Action,
    Answered,
    Fetch,
    Fetched,
    Notify,
    Observe,
    Pace,
    Paced,
    Record,
    Reply,
    Send,
    Sleep,
    TransportFailure,
    WireRequest,
)

# What telemetry calls a request of no budget kind: the only such is a result's download.
DOWNLOAD = "download"

T = TypeVar("T")
Flow = Generator[Action, Any, T]

log = logging.getLogger("imggw_client")

EXPIRED_STATUSES = frozenset({403, 404, 410})
NOT_AN_IMAGE = "not_an_image"  # a result link served a document (an error page, say)
RESULT_TOO_LARGE = "result_too_large"  # a result past the caller's max_bytes
FINAL_QUERY_LEAD = 1.0  # the last query of a wait goes out this long before its deadline (at most)


def new_idempotency_key() -> str:
    """A fresh key: 128 random bits, as 32 hex characters."""
    return _secrets.token_hex(16)


def file_stem(task_id: str, index: int) -> str:
    """Result files are named from the task id and the result's index, never from the URL."""
    return f"{task_id}-{index}"


class Flows:
    """Builds the flows of one client. ``clock`` is monotonic seconds, ``wall`` epoch seconds
    (for ``Retry-After`` dates), ``rng`` draws every jitter. ``budget`` is the request budget,
    shared with the client's ``with_options`` copies (a new one from the settings if None); a
    :class:`RemoteBudget` (one shared by many processes) is asked through the driver.
    ``durations`` is what the client learned of how long its tasks take (DESIGN 15), shared
    the same way."""

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
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self.rng = rng if rng is not None else random.Random()
        self.budget: Budget | RemoteBudget = (
            budget if budget is not None else Budget(settings.rate_limit)
        )
        self.durations = durations if durations is not None else DurationModel()
        self._secrets = (settings.api_key,)
        # Whether flows yield Observe actions (DESIGN 17): set by a client whose telemetry is
        # on, so that a client without it pays nothing for them.
        self.observe = False
        # Whether flows yield Record actions (DESIGN 19): set by a client that keeps a journal.
        self.journaled = False

    def surface(self, surface: str | None) -> Surface:
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
        return self._submit(request, surface, key, validate, chosen=idempotency_key is not None,
                            extra=extra)  # fmt: skip

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
        asked = (("surface", surface, err.surface),
                 ("idempotency_key", idempotency_key, err.idempotency_key))  # fmt: skip
        for name, given, own in asked:
            if given is not None and given != own:
                rule = f"must be the error's own ({own!r}) to resend its submit, or left out"
                raise_violations([rules.Violation(name, rule, reasons.INVALID_REQUEST.code)])
        # The request is sent as it was built (checked or not): the same bytes, so a replay.
        surface = self.surface(err.surface)
        return self._submit(err.request, surface, err.idempotency_key, False, chosen=True,
                            extra=extra)  # fmt: skip

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
                submission = surfaces.read_submit(surface, outcome, key, self.wall(), secrets,
                                                  resolution=request.resolution)  # fmt: skip
            except NotFoundError as err:
                url = self.settings.base_url + wire.path
                raise surfaces.no_submit_route(surface, url, err) from err
            except ImggwError as err:
                may_exist = may_exist or classify(err).unknown
                raise
            may_exist = True
            return submission.model_copy(update={"request": request})  # what it was made from

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
                submission = yield from self._attempts(send, read, give_up, kind=SUBMIT)
            except BaseException as exc:
                if (in_flight or may_exist) and is_interruption(exc):
                    _carry_key(exc, request, surface, key, chosen=chosen)
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
        wire = self._headed(surfaces.build_query(surface, task_id),
                            _checked_headers(extra_headers))  # fmt: skip
        flow = self._attempts(
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
        schedule = plan_wait(self.settings.poll, self.durations, kind, started=started,
                             accepted=accepted, now=now, rng=self.rng)  # fmt: skip
        return self._wait(surface, task_id, _checked_timeout(timeout), schedule, started,
                          submission, extra, origin)  # fmt: skip

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
        """Every query is bounded by what is left of ``timeout``; the last goes out ``lead``
        before the deadline, and the wait ends at the deadline. ``timeout=0`` checks once. A
        wait that times out hands its surface and ``submission`` to its error: waiting on the
        error again resumes this wait. Each task read gets ``origin``'s fields (its request
        and key)."""
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
            return WaitTimeoutError(task_id, last, timeout=timeout, surface=surface,
                                    submission=submission)  # fmt: skip

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
            task = yield from self._attempts(
                send, read, give_up, kind=QUERY, deadline=deadline if bounded else None,
                priority=priority,
            )  # fmt: skip
            now = self.clock()
            if (task.status, task.progress) != seen:
                if self.journaled and (seen is None or seen[0] is not task.status):
                    yield Record(states.Seen(task))
                seen = (task.status, task.progress)
                yield Notify(task)
            last = task
            if task.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED) and self.observe:
                took = -1.0 if started is None else max(0.0, now - started)  # -1: not known
                yield Observe(TASK_DONE, value=took, surface=surface, task_id=task_id,
                              status=task.status.value)  # fmt: skip
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
        yield Answered(submission)  # the caller's on_submit, before any wait
        if self.observe:
            yield Observe(PHASE, kind="wait", task_id=submission.task_id)
        try:
            return (yield from self.wait(submission, surface=None, timeout=timeout,
                                         extra_headers=extra))  # fmt: skip
        except BaseException as exc:
            if is_interruption(exc):  # the caller never saw the task id: name it
                _carry_task(exc, submission)
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
        _check_downloadable(task)
        limits = _fetch_settings(max_bytes, self.settings.timeout if timeout is None else timeout)
        prefix = _checked_prefix(prefix)
        fresh = _Refresh(self, task)
        return [
            cast(
                Flow[DownloadedFile],
                self._download_or_refresh(task, index, dest_dir, overwrite, limits, fresh, prefix),
            )
            for index in range(len(task.image_urls))
        ]

    def opened(
        self, task: Task, index: int, *, max_bytes: int, timeout: float | None = None
    ) -> Flow[BinaryIO]:
        """Result ``index`` of a succeeded task, fetched and verified exactly as a download
        is (its declared length or its image's end, ``max_bytes``, a dead link asked for
        again), into a stream the driver holds instead of a file: returned at its start, for
        the caller to read and close. Nothing is written where the caller would see it."""
        _check_downloadable(task)
        if (isinstance(index, bool) or not isinstance(index, int)
                or not 0 <= index < len(task.image_urls)):  # fmt: skip
            count = len(task.image_urls)
            rule = f"must be the index of one of the task's {count} results (0 to {count - 1})"
            raise_violations([rules.Violation("index", rule, "invalid_index")])
        limits = _fetch_settings(max_bytes, self.settings.timeout if timeout is None else timeout)
        flow = self._download_or_refresh(task, index, None, False, limits, _Refresh(self, task), "")
        return cast(Flow[BinaryIO], flow)

    def _download_or_refresh(
        self,
        task: Task,
        index: int,
        dest_dir: Path | None,
        overwrite: bool,
        limits: tuple[int, float],
        fresh: _Refresh,
        prefix: str,
    ) -> Flow[DownloadedFile | BinaryIO]:
        """A dead link (403/404/410, or past ``expires_at``) is not proof the result is gone:
        many gateways sign a new link on every query. So the task is queried once more (once
        for all its files) and the link it hands out now is tried; ``ResultExpiredError`` only
        when that fails too, or is the very link that died. A link skipped for its stated
        expiry is still tried when no fresh one can be had: clocks and stated expiries can be
        wrong. A query that fails for a while (network, 5xx, 429) raises its own error, worth
        retrying later: it says nothing about the result."""
        url, stem = task.image_urls[index], prefix + file_stem(task.id, index)
        dead: ResultExpiredError | None = None
        if task.expires_at is None or task.expires_at.timestamp() > self.wall():
            try:
                return (yield from self._download(task, url, dest_dir, stem, overwrite, limits))
            except ResultExpiredError as err:
                dead = err
        try:
            refreshed = yield from fresh.task()
        except (AuthenticationError, PermissionDeniedError):
            raise
        except ImggwError as err:
            if dead is None:  # the link was skipped on its stated expiry: the last hope
                try:
                    return (yield from self._download(task, url, dest_dir, stem, overwrite, limits))
                except ResultExpiredError as link_dead:
                    dead = link_dead
            if isinstance(err, ResultExpiredError):  # no fresh link: the dead one says why
                raise dead from err
            raise err
        new = refreshed.image_urls[index] if index < len(refreshed.image_urls) else None
        if new is None or (new == url and dead is not None):
            raise dead or _expired(task, stem, "the gateway lists no link for it any more")
        log.info("result %s of task %s: its link died; trying the one it has now", stem, task.id)
        return (yield from self._download(refreshed, new, dest_dir, stem, overwrite, limits))

    def _download(
        self,
        task: Task,
        url: str,
        dest_dir: Path | None,
        stem: str,
        overwrite: bool,
        limits: tuple[int, float],
    ) -> Flow[DownloadedFile | BinaryIO]:
        """``dest_dir`` None: the result is held by the driver (``Fetched.body``)."""
        max_bytes, timeout = limits
        host = link_origin(url)  # never the link itself: its query may hold a signature

        def read(outcome: Fetched | TransportFailure) -> DownloadedFile | BinaryIO:
            if isinstance(outcome, TransportFailure):
                raise surfaces.transport_error(task.surface, outcome, host=host) from outcome.error
            if outcome.file is not None:
                return outcome.file
            if outcome.body is not None:
                return outcome.body
            if outcome.too_large:
                raise DownloadError(
                    f"result {stem} of task {task.id} is larger than max_bytes={max_bytes}; "
                    "nothing was saved (pass a larger max_bytes to accept it)",
                    code=RESULT_TOO_LARGE,
                    surface=task.surface,
                )
            if outcome.incomplete:
                cut = "the file was cut short"
                raise surfaces.malformed(task.surface, outcome.status, cut, host=host)
            if outcome.document is not None:  # a proxy's page, say: maybe not for long
                raise ServerError(
                    f"result {stem} of task {task.id}: its link served a document "
                    f"({printable(outcome.document, 60)}), not an image; nothing was saved",
                    status_code=outcome.status, code=NOT_AN_IMAGE, surface=task.surface,
                )  # fmt: skip
            if outcome.status in EXPIRED_STATUSES:
                raise _expired(task, stem, f"its link answered HTTP {outcome.status}",
                               outcome.status)  # fmt: skip
            status = outcome.status
            if status == 429:
                raise RateLimitError(f"result link answered HTTP {status}", surface=task.surface)
            if status >= 500 or status == 408:
                raise ServerError(f"result link answered HTTP {status}", status_code=status)
            raise DownloadError(
                f"result {stem} of task {task.id}: unexpected HTTP {status}",
                status_code=status,
                surface=task.surface,
            )

        def give_up(err: ImggwError, unknown: bool) -> ImggwError:
            if isinstance(err, (ResultExpiredError, DownloadError)):
                return err
            return DownloadError(
                f"could not download result {stem} of task {task.id}: {err.message}",
                status_code=err.status_code,
                code=NOT_AN_IMAGE if err.code == NOT_AN_IMAGE else None,
                surface=task.surface,
            )

        return self._attempts(
            lambda: Fetch(url, dest_dir, stem, overwrite, timeout, max_bytes), read, give_up
        )

    # ------------------------------------------------------------------------ machinery

    def _headed(self, wire: WireRequest, extra: Mapping[str, str] | None) -> WireRequest:
        """``wire`` with the caller's headers: the client's ``default_headers``, then the
        call's ``extra_headers``, each replacing a header of the same name (in any case).
        Neither may name the key's header or the idempotency key's (refused when checked);
        the driver sets the key last."""
        added = [*self.settings.headers, *(extra or {}).items()]
        if not added:
            return wire
        headers = dict(wire.headers or {})
        for name, value in added:
            for same in [have for have in headers if have.lower() == name.lower()]:
                del headers[same]
            headers[name] = value
        return replace(wire, headers=headers)

    def _task_reader(
        self, surface: Surface, task_id: str
    ) -> Callable[[Reply | TransportFailure], Task]:
        def read(outcome: Reply | TransportFailure) -> Task:
            try:
                return surfaces.read_task(surface, outcome, task_id, self.wall(), self._secrets)
            except NotFoundError as err:
                err.task_id = task_id  # which task is unknown: one of many, in as_completed
                raise

        return read

    def _attempts(
        self,
        make_action: Callable[[], Action],
        read: Callable[[Any], T],
        give_up: Callable[[ImggwError, bool], ImggwError] | None = None,
        *,
        kind: str | None = None,
        deadline: float | None = None,
        priority: Callable[[], float] | None = None,
    ) -> Flow[T]:
        """Performs an action until ``read`` accepts its outcome, retrying what ``classify``
        calls retryable: up to ``max_attempts``, or, with a ``deadline``, until it passes.
        Requests of a ``kind`` (submit, query) each wait for a slot of the client's budget, in
        the order of their ``priority`` (see :meth:`Budget.reserve`; by default, their own)."""
        attempt, unknown = 0, False
        while True:
            attempt += 1
            ticket = None
            if kind is not None:
                asked = self.clock()
                ticket = yield from self._slot(
                    kind, deadline, priority() if priority is not None else None
                )
                if self.observe and ticket is not None:
                    yield Observe(BUDGET_WAIT, value=self.clock() - asked, kind=kind)
                if ticket is None:
                    err = APITimeoutError(
                        "the request budget left no slot before the deadline", request_sent=False
                    )
                    raise (give_up(err, unknown) if give_up else err) from None
            action = make_action()
            if isinstance(ticket, Ticket) and isinstance(action, Send):
                assert isinstance(self.budget, Budget)
                gate = self.budget.gate(ticket, self.clock)
                if gate is not None:  # paced: the write itself waits its turn too
                    action = replace(action, gate=gate)
            try:
                outcome = yield action
            except BaseException:  # cancelled or closed in flight: its place counts no more
                if isinstance(ticket, Ticket):
                    assert isinstance(self.budget, Budget)
                    self.budget.release(ticket)
                raise
            try:
                result = read(outcome)
            except ImggwError as err:
                verdict = classify(err)
                unknown = unknown or verdict.unknown
                if self.observe:
                    yield Observe(REQUEST, kind=kind or DOWNLOAD,
                                  outcome=_outcome(err, verdict.unknown),
                                  limited=isinstance(err, RateLimitError))  # fmt: skip
                limited = isinstance(err, RateLimitError) and ticket is not None
                if ticket is not None:
                    hint = err.retry_after if isinstance(err, RateLimitError) else None
                    retry = self.settings.retry
                    backoff = (retry.initial_backoff, retry.max_backoff)
                    if isinstance(ticket, Ticket):
                        assert isinstance(self.budget, Budget)
                        self.budget.finished(
                            ticket, self.clock(), limited=limited, retry_after=hint,
                            backoff=backoff,
                        )  # fmt: skip
                    else:
                        yield Paced(ticket, limited=limited, retry_after=hint, backoff=backoff)
                delay = self._delay(verdict, attempt, deadline, budgeted=limited)
                if delay is None:
                    final = give_up(err, unknown) if give_up else err
                    if final is err:
                        raise
                    raise final from err
                log.info(
                    "retrying %s in %.2fs (attempt %d failed: %s)",
                    _describe(action),
                    delay,
                    attempt,
                    err.message,
                )
            else:
                if self.observe:
                    yield Observe(REQUEST, kind=kind or DOWNLOAD, outcome="ok")
                if isinstance(ticket, Ticket):
                    assert isinstance(self.budget, Budget)
                    self.budget.finished(ticket, self.clock())
                elif ticket is not None:
                    yield Paced(ticket)
                return result
            if delay > 0:
                yield Sleep(delay)

    def _slot(
        self, kind: str, deadline: float | None, priority: float | None = None
    ) -> Flow[Ticket | object | None]:
        """Waits for the budget's slot of one request; None if it comes only past ``deadline``
        (the wait then sleeps to the deadline: it ends there, not sooner). A budget held
        elsewhere hands out its slots in request order: ``priority`` is for this process's."""
        if isinstance(self.budget, RemoteBudget):
            return (yield from self._remote_slot(kind, deadline))
        ticket = self.budget.reserve(kind, self.clock(), priority=priority)
        try:
            while True:
                now = self.clock()
                if deadline is not None and now >= deadline:  # a request now would get no time
                    self.budget.release(ticket)
                    return None
                wait = self.budget.wait_time(ticket, now)
                if wait <= 0:
                    return ticket
                if deadline is not None and now + wait >= deadline:
                    self.budget.release(ticket)
                    if deadline > now:
                        yield Sleep(deadline - now)
                    return None
                yield Sleep(wait)
        except BaseException:  # closed or cancelled while it waited: the place is given back
            self.budget.release(ticket)
            raise

    def _remote_slot(self, kind: str, deadline: float | None) -> Flow[object | None]:
        """The same as :meth:`_slot` for a budget held elsewhere: the driver asks it; the
        deadline is still ours."""
        ticket, wait = yield Pace(kind)
        while wait > 0:
            now = self.clock()
            if deadline is not None and now + wait >= deadline:
                yield Paced(ticket, sent=False)
                if deadline > now:
                    yield Sleep(deadline - now)
                return None
            yield Sleep(wait)
            ticket, wait = yield Pace(kind, ticket)
        if deadline is not None and self.clock() >= deadline:
            yield Paced(ticket, sent=False)
            return None
        return ticket  # type: ignore[no-any-return]  # what the service handed out

    def _delay(
        self, verdict: Verdict, attempt: int, deadline: float | None, *, budgeted: bool = False
    ) -> float | None:
        """Seconds before the next attempt, or None to give up. A 429 the budget has seen is
        paced by the budget (a pause for the whole client), so it adds no sleep of its own."""
        if deadline is None:
            delay = next_delay(self.settings.retry, attempt, verdict, self.rng)
            return None if delay is None else (0.0 if budgeted else delay)
        # Inside a wait only the deadline bounds retries: a flaky query must not end a wait.
        remaining = deadline - self.clock()
        if not verdict.retry or remaining <= 0:
            return None
        if budgeted:
            return 0.0
        if verdict.retry_after is not None:
            return min(honour_retry_after(verdict.retry_after, self.settings.retry, attempt,
                                          self.rng), remaining)  # fmt: skip
        return min(backoff(self.settings.retry, attempt, self.rng), remaining)


def _origin(made: Submission | Task | None) -> dict[str, Any]:
    """What a task was made from, as its fields: the request and key ``made`` knows."""
    if made is None:
        return {}
    known = {"request": made.request, "idempotency_key": made.idempotency_key}
    return {name: value for name, value in known.items() if value is not None}


def is_interruption(exc: BaseException) -> bool:
    """Whether ``exc`` interrupts an operation from outside (a cancellation of asyncio, trio
    or anyio, Ctrl-C, ``SystemExit``) rather than being an error of it; never the
    ``GeneratorExit`` that closes a flow."""
    return not isinstance(exc, (Exception, GeneratorExit))


def interrupt(flow: Flow[Any], exc: BaseException) -> None:
    """Hands a flow the interruption that stopped its driver, so that it can say what a caller
    needs to resume (a submit names its key on ``exc``), and closes it. The driver then raises
    ``exc`` itself: nothing here replaces it. An error of the driver's own is not the flow's to
    handle: the flow is only closed (its places given back)."""
    if not is_interruption(exc):
        flow.close()
        return
    try:
        flow.throw(exc)
    except BaseException:
        return
    flow.close()  # it went on instead of stopping: it may not


def _refused(exc: BaseException, may_exist: bool) -> bool:
    """Whether a submit's failure is the gateway's refusal, for good: an answer (a 4xx) that
    makes no task. Anything else (not sent, no answer, an unknown outcome) may have a task."""
    if may_exist or not isinstance(exc, ImggwError) or isinstance(exc, UnknownOutcomeError):
        return False
    status = exc.status_code
    return status is not None and 400 <= status < 500 and not classify(exc).unknown


def _carry_key(
    exc: BaseException, request: ImageRequest, surface: Surface, key: str, *, chosen: bool
) -> None:
    """A submit stopped after its request left: a task may exist, billed. The exception gets
    a note (PEP 678) with the key and the call that resends the submit without paying twice,
    and one WARNING says the same; neither holds the prompt or the API key. A key the caller
    chose is one it holds (a batch's ledger, the CLI's own message): said at INFO, so that a
    run stopping many submits at once does not repeat what it prints itself."""
    ratio, resolution = request.aspect_ratio, request.resolution
    shell = " ".join(shlex.quote(part) for part in (
        "--surface", surface, "--aspect-ratio", ratio, "--resolution", resolution,
        "--idempotency-key", key,
    ))  # fmt: skip
    add_note(
        exc,
        f"imggw: this submit was stopped after its request was sent: a task may exist, "
        f"billed, under idempotency_key={key!r}. Resend it with that key to get the same task "
        f"without paying twice: client.submit(PROMPT, aspect_ratio={ratio!r}, "
        f"resolution={resolution!r}, surface={surface!r}, idempotency_key={key!r}) or "
        f"imggw submit PROMPT {shell}",
    )
    log.log(
        logging.INFO if chosen else logging.WARNING,
        "a submit was stopped (%s) after its request was sent: a task may exist, billed; "
        "resend it with idempotency_key=%r on surface %s to get that task without paying twice",
        type(exc).__name__, key, surface,
    )  # fmt: skip


def _carry_task(exc: BaseException, submission: Submission) -> None:
    """A generate stopped while it waited: its task runs on, billed, and its caller never saw
    the id. As :func:`_carry_key`: a note and one WARNING, with the id and the key."""
    task_id, surface = submission.task_id, submission.surface
    add_note(
        exc,
        f"imggw: task {task_id} (surface {surface}, idempotency_key="
        f"{submission.idempotency_key!r}) was created and goes on, billed. Wait on it instead "
        f"of submitting again: client.wait({task_id!r}, surface={surface!r}) or "
        f"imggw poll {task_id} --surface {surface}",
    )
    log.warning(
        "generate was stopped (%s) while waiting: task %s (surface %s, idempotency_key=%r) goes "
        "on, billed; wait on it instead of submitting again",
        type(exc).__name__, task_id, surface, submission.idempotency_key,
    )  # fmt: skip


class _Refresh:
    """One more query of a task whose links died, shared by the flows of its files: a file
    whose link dies after the query was answered uses its answer; files whose links die while
    it is in flight (concurrent downloads) each send their own, at most one per file."""

    def __init__(self, flows: Flows, task: Task) -> None:
        self.flows = flows
        self.original = task
        self.refreshed: Task | None = None

    def task(self) -> Flow[Task]:
        if self.refreshed is None:
            task = self.original
            try:
                latest = yield from self.flows.get(task.id, surface=task.surface)
            except NotFoundError as err:  # the task is gone; other errors say nothing of it
                why = f"the gateway no longer knows the task: {err.message}"
                raise _expired(task, "", why) from err
            if latest.status is not TaskStatus.SUCCEEDED:
                raise _expired(task, "", f"the task is now {latest.status.value}")
            self.refreshed = latest
        return self.refreshed


def _check_downloadable(task: object) -> None:
    """A task whose results can be fetched: a :class:`Task`, checked (it may come from stored
    data, and its id names files), succeeded, with links."""
    if not isinstance(task, Task):
        rule = "must be a Task (for a task id, call get(task_id) and download that)"
        raise_violations([rules.Violation("task", rule, "invalid_task")])
    assert isinstance(task, Task)
    # Before any path is built from them: a Task may come from stored data.
    raise_violations(rules.check_task_identity(task.id, task.surface))
    if task.status is TaskStatus.FAILED:
        raise TaskFailedError(task)
    if task.status is not TaskStatus.SUCCEEDED:
        raise DownloadError(
            f"task {task.id} has not succeeded yet ({task.status.value}): wait for it first",
            surface=task.surface,
        )
    if not task.image_urls:
        raise DownloadError(f"task {task.id} succeeded without result URLs", surface=task.surface)


def _expired(task: Task, stem: str, why: str, status: int | None = None) -> ResultExpiredError:
    what = f"result {stem} of task {task.id}" if stem else f"the results of task {task.id}"
    return ResultExpiredError(
        f"{what} can no longer be downloaded ({why}); its retention window has passed",
        status_code=status,
        code=reasons.RESULT_EXPIRED.code,
        surface=task.surface,
    )


def _fetch_settings(max_bytes: object, timeout: object) -> tuple[int, float]:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        rule = rules.Violation("max_bytes", "must be an integer >= 1", "invalid_max_bytes")
        raise_violations([rule])
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise_violations([rules.Violation("timeout", "must be seconds > 0", "invalid_timeout")])
    assert isinstance(max_bytes, int)
    assert isinstance(timeout, (int, float))
    return max_bytes, float(timeout)


_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,64}")


def _checked_prefix(prefix: object) -> str:
    # Letters, digits, "-" and "_" only: a prefix never leaves the folder nor hides a file.
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        rule = "must be at most 64 letters, digits, '-' or '_'"
        raise_violations([rules.Violation("prefix", rule, "invalid_prefix")])
    assert isinstance(prefix, str)
    return prefix


def _checked_headers(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """A call's ``extra_headers``, checked before anything is sent."""
    if headers is not None:
        raise_violations(rules.check_headers(headers, "extra_headers"))
    return headers


def _checked_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise_violations([rules.Violation("timeout", "must be seconds >= 0", "invalid_timeout")])
    assert isinstance(timeout, (int, float))
    return float(timeout)


def _checked_task_id(task_id: object) -> str:
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    raise_violations(rules.check_task_id(task_id))
    assert isinstance(task_id, str)
    return task_id


def _outcome(err: ImggwError, unknown: bool) -> str:
    """How a failed attempt ended, in a few words (a metric's attribute: few values)."""
    if isinstance(err, RateLimitError):
        return err.code or "limited"  # the reason's own code (rate_limited)
    return "unknown" if unknown else "error"


def _describe(action: Action) -> str:
    if isinstance(action, Send):
        return f"{action.request.method} {action.request.path}"
    if isinstance(action, Fetch):
        return f"download of {action.stem}"
    return type(action).__name__
