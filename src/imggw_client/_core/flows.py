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
import secrets as _secrets
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, TypeVar

from .._config import Settings, Surface, check_surface
from .._exceptions import (
    DownloadError,
    ImggwError,
    RateLimitError,
    ResultExpiredError,
    ServerError,
    TaskFailedError,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from .._models import DownloadedFile, ImageRequest, Submission, Task, TaskStatus, raise_violations
from . import rules, surfaces
from .poll import poll_interval
from .retry import Verdict, backoff, classify, honour_retry_after, next_delay
from .wire import Action, Fetch, Fetched, Notify, Reply, Send, Sleep, TransportFailure

T = TypeVar("T")
Flow = Generator[Action, Any, T]

log = logging.getLogger("imggw_client")

EXPIRED_STATUSES = frozenset({403, 404, 410})
MIN_FINAL_QUERY_TIMEOUT = 2.0


def new_idempotency_key() -> str:
    """A fresh key: 128 random bits, as 32 hex characters."""
    return _secrets.token_hex(16)


def file_stem(task_id: str, index: int) -> str:
    """Result files are named from the task id and the result's index, never from the URL."""
    return f"{task_id}-{index}"


class Flows:
    """Builds the flows of one client. ``clock`` is monotonic seconds, ``wall`` epoch seconds
    (for ``Retry-After`` dates), ``rng`` draws every jitter."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self.rng = rng if rng is not None else random.Random()
        self._secrets = (settings.api_key,)

    def surface(self, surface: str | None) -> Surface:
        return self.settings.surface if surface is None else check_surface(surface)

    # ------------------------------------------------------------------------ operations

    def submit(
        self,
        prompt: str,
        *,
        aspect_ratio: str,
        resolution: str,
        surface: str | None,
        idempotency_key: str | None,
        validate: bool = True,
    ) -> Flow[Submission]:
        """Submits one logical request; every retry carries the same idempotency key."""
        surface = self.surface(surface)
        if validate:
            request = ImageRequest(prompt, aspect_ratio, resolution)
        else:
            request = ImageRequest.unchecked(prompt, aspect_ratio, resolution)
        if idempotency_key is None:
            key = new_idempotency_key()
        else:
            raise_violations(rules.check_idempotency_key(idempotency_key))
            key = idempotency_key
        wire = surfaces.build_submit(surface, request, key, validate=validate)
        secrets = (*self._secrets, request.prompt)

        def read(outcome: Reply | TransportFailure) -> Submission:
            return surfaces.read_submit(surface, outcome, key, self.wall(), secrets)

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
            submission = yield from self._attempts(
                lambda: Send(wire, self.settings.timeout), read, give_up
            )
            submission._accepted_at = self.clock()
            return submission

        return stamped()

    def get(self, task_id: str, *, surface: str | None) -> Flow[Task]:
        """One query (retried on transient failures)."""
        surface, task_id = self.surface(surface), _checked_task_id(task_id)
        wire = surfaces.build_query(surface, task_id)
        return self._attempts(
            lambda: Send(wire, self.settings.timeout), self._task_reader(surface, task_id)
        )

    def wait(
        self,
        task: str | Submission | Task,
        *,
        surface: str | None,
        timeout: float,
    ) -> Flow[Task]:
        """Polls until the task is terminal or ``timeout`` seconds pass. Never submits."""
        first_sleep = 0.0
        if isinstance(task, Submission):
            task_id, surface = task.task_id, task.surface
            if task._accepted_at is not None:
                # Just submitted: it is pending, and a query now could only say so.
                since = max(0.0, self.clock() - task._accepted_at)
                first_sleep = poll_interval(self.settings.poll, 0, self.rng) - since
        elif isinstance(task, Task):
            task_id, surface = task.id, task.surface
        else:
            task_id = task
        surface, task_id = self.surface(surface), _checked_task_id(task_id)
        return self._wait(surface, task_id, _checked_timeout(timeout), first_sleep=first_sleep)

    def _wait(
        self, surface: Surface, task_id: str, timeout: float, *, first_sleep: float = 0.0
    ) -> Flow[Task]:
        deadline = self.clock() + timeout
        wire = surfaces.build_query(surface, task_id)
        read = self._task_reader(surface, task_id)
        last: Task | None = None
        seen: tuple[TaskStatus, int | None] | None = None

        def send() -> Send:
            remaining = deadline - self.clock()
            return Send(wire, min(self.settings.timeout, max(remaining, MIN_FINAL_QUERY_TIMEOUT)))

        def give_up(err: ImggwError, unknown: bool) -> ImggwError:
            # Out of time while the gateway was unreachable: still not a failure of the task.
            if classify(err).retry:
                return WaitTimeoutError(task_id, last, timeout=timeout)
            return err

        polls = 0
        if first_sleep > 0 and timeout > 0:
            yield Sleep(min(first_sleep, timeout))
            polls = 1
        while True:
            task = yield from self._attempts(send, read, give_up, deadline=deadline)
            if (task.status, task.progress) != seen:
                seen = (task.status, task.progress)
                yield Notify(task)
            last = task
            if task.status is TaskStatus.SUCCEEDED:
                return task
            if task.status is TaskStatus.FAILED:
                raise TaskFailedError(task)
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise WaitTimeoutError(task_id, last, timeout=timeout)
            yield Sleep(min(poll_interval(self.settings.poll, polls, self.rng), remaining))
            polls += 1

    def generate(
        self,
        prompt: str,
        *,
        aspect_ratio: str,
        resolution: str,
        surface: str | None,
        idempotency_key: str | None,
        timeout: float,
        validate: bool = True,
    ) -> Flow[Task]:
        """Submit, then wait. A slow task is waited on, never replaced by a new submission."""
        timeout = _checked_timeout(timeout)  # before the submit: a bad value must cost nothing
        submission = yield from self.submit(
            prompt,
            aspect_ratio=aspect_ratio,
            resolution=resolution,
            surface=surface,
            idempotency_key=idempotency_key,
            validate=validate,
        )
        return (yield from self.wait(submission, surface=None, timeout=timeout))

    def downloads(
        self, task: Task, dest_dir: Path, *, overwrite: bool
    ) -> list[Flow[DownloadedFile]]:
        """One flow per result URL of a succeeded task, to run one after another or at once."""
        if not isinstance(task, Task):
            rule = "must be a Task (for a task id, call get(task_id) and download that)"
            raise_violations([rules.Violation("task", rule, "invalid_task")])
        if task.status is TaskStatus.FAILED:
            raise TaskFailedError(task)
        if task.status is not TaskStatus.SUCCEEDED:
            raise DownloadError(
                f"task {task.id} has not succeeded yet ({task.status.value}): wait for it first",
                surface=task.surface,
            )
        if not task.image_urls:
            raise DownloadError(
                f"task {task.id} succeeded without result URLs", surface=task.surface
            )
        return [
            self._download(task, url, dest_dir, file_stem(task.id, index), overwrite)
            for index, url in enumerate(task.image_urls)
        ]

    def _download(
        self, task: Task, url: str, dest_dir: Path, stem: str, overwrite: bool
    ) -> Flow[DownloadedFile]:
        def read(outcome: Fetched | TransportFailure) -> DownloadedFile:
            if isinstance(outcome, TransportFailure):
                raise surfaces.transport_error(task.surface, outcome) from outcome.error
            if outcome.file is not None:
                return outcome.file
            if outcome.incomplete:
                raise surfaces.malformed(task.surface, outcome.status, "the body ended early")
            if outcome.status in EXPIRED_STATUSES:
                raise ResultExpiredError(
                    f"result {stem} of task {task.id} is no longer available "
                    f"(HTTP {outcome.status}): its retention window has passed",
                    status_code=outcome.status,
                    code="result_expired",
                    surface=task.surface,
                )
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
                surface=task.surface,
            )

        return self._attempts(
            lambda: Fetch(url, dest_dir, stem, overwrite, self.settings.timeout), read, give_up
        )

    # ------------------------------------------------------------------------ machinery

    def _task_reader(
        self, surface: Surface, task_id: str
    ) -> Callable[[Reply | TransportFailure], Task]:
        def read(outcome: Reply | TransportFailure) -> Task:
            return surfaces.read_task(surface, outcome, task_id, self.wall(), self._secrets)

        return read

    def _attempts(
        self,
        make_action: Callable[[], Action],
        read: Callable[[Any], T],
        give_up: Callable[[ImggwError, bool], ImggwError] | None = None,
        *,
        deadline: float | None = None,
    ) -> Flow[T]:
        """Performs an action until ``read`` accepts its outcome, retrying what ``classify``
        calls retryable: up to ``max_attempts``, or, with a ``deadline``, until it passes."""
        attempt, unknown = 0, False
        while True:
            attempt += 1
            action = make_action()
            outcome = yield action
            try:
                return read(outcome)
            except ImggwError as err:
                verdict = classify(err)
                unknown = unknown or verdict.unknown
                delay = self._delay(verdict, attempt, deadline)
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
            yield Sleep(delay)

    def _delay(self, verdict: Verdict, attempt: int, deadline: float | None) -> float | None:
        if deadline is None:
            return next_delay(self.settings.retry, attempt, verdict, self.rng)
        # Inside a wait only the deadline bounds retries: a flaky query must not end a wait.
        remaining = deadline - self.clock()
        if not verdict.retry or remaining <= 0:
            return None
        if verdict.retry_after is not None:
            return min(honour_retry_after(verdict.retry_after, self.rng), remaining)
        return min(backoff(self.settings.retry, attempt, self.rng), remaining)


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


def _describe(action: Action) -> str:
    if isinstance(action, Send):
        return f"{action.request.method} {action.request.path}"
    if isinstance(action, Fetch):
        return f"download of {action.stem}"
    return type(action).__name__
