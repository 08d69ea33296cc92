"""A succeeded task's results fetched, with no I/O: into files, or into a stream the caller reads.

Each result is one flow of ``Fetch`` attempts, checked as it arrives (its length, an image and
not a document, ``max_bytes``). A dead link is not proof the result is gone: the task is asked
for again, once for all its results, and the link it hands out now is tried.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, cast

from . import reasons, rules, surfaces
from .attempts import Attempts
from .exceptions import (
    AuthenticationError,
    ClientClosedError,
    DownloadError,
    ImggwError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ResultExpiredError,
    ServerError,
    TaskFailedError,
)
from .models import DownloadedFile, Task, TaskStatus, blank_when_shown, raise_violations
from .text import blank, link_origin, printable
from .wire import Fetch, Fetched, Flow, TransportFailure

log = logging.getLogger("imggw_client")

EXPIRED_STATUSES = frozenset({403, 404, 410})
NOT_AN_IMAGE = "not_an_image"  # a result link served a document (an error page, say)
RESULT_TOO_LARGE = "result_too_large"  # a result past the caller's max_bytes

_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,64}")


def file_stem(task_id: str, index: int) -> str:
    """Result files are named from the task id and the result's index, never from the URL."""
    return f"{task_id}-{index}"


class Results:
    """The flows fetching one succeeded task's results, through ``calls``' attempts.
    ``requery`` asks the gateway for the task again when a link died."""

    def __init__(
        self, calls: Attempts, task: object, requery: Callable[[Task], Flow[Task]]
    ) -> None:
        _check_downloadable(task)
        assert isinstance(task, Task)
        self.calls, self.task, self.requery = calls, task, requery
        # The task asked for again, shared by the flows of its files: a file whose link dies
        # after the query was answered uses its answer; files whose links die while it is in
        # flight (concurrent downloads) each send their own, at most one per file.
        self.refreshed: Task | None = None

    def files(
        self,
        dest_dir: Path,
        *,
        overwrite: bool,
        max_bytes: int,
        timeout: float | None = None,
        prefix: str = "",
    ) -> list[Flow[DownloadedFile]]:
        """One flow per result URL, to run one after another or at once."""
        limits = self._limits(max_bytes, timeout)
        prefix = _checked_prefix(prefix)
        return [
            cast(Flow[DownloadedFile], self.result(index, dest_dir, overwrite, limits, prefix))
            for index in range(len(self.task.image_urls))
        ]

    def opened(self, index: int, *, max_bytes: int, timeout: float | None = None) -> Flow[BinaryIO]:
        """Result ``index`` into a stream the driver holds, returned at its start."""
        count = len(self.task.image_urls)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            rule = f"must be the index of one of the task's {count} results (0 to {count - 1})"
            raise_violations([rules.Violation("index", rule, "invalid_index")])
        limits = self._limits(max_bytes, timeout)
        return cast(Flow[BinaryIO], self.result(index, None, False, limits, ""))

    def result(
        self,
        index: int,
        dest_dir: Path | None,
        overwrite: bool,
        limits: tuple[int, float],
        prefix: str,
    ) -> Flow[DownloadedFile | BinaryIO]:
        """Result ``index``, its link asked for again if it died (403/404/410, or past
        ``expires_at``); ``ResultExpiredError`` only when the fresh link fails too, or is the
        very link that died. A link skipped for its stated expiry is still tried when no fresh
        one can be had: clocks and stated expiries can be wrong. A query that fails for a while
        (network, 5xx, 429) raises its own error: it says nothing about the result."""
        task = self.task
        url, stem = task.image_urls[index], prefix + file_stem(task.id, index)
        dead: ResultExpiredError | None = None
        if task.expires_at is None or task.expires_at.timestamp() > self.calls.wall():
            try:
                return (yield from self._fetch(task, url, dest_dir, stem, overwrite, limits))
            except ResultExpiredError as err:
                dead = err
        try:
            refreshed = yield from self._refreshed()
        except (AuthenticationError, PermissionDeniedError):
            raise
        except ImggwError as err:
            if dead is None:  # the link was skipped on its stated expiry: the last hope
                try:
                    return (yield from self._fetch(task, url, dest_dir, stem, overwrite, limits))
                except ResultExpiredError as link_dead:
                    dead = link_dead
            if isinstance(err, ResultExpiredError):  # no fresh link: the dead one says why
                raise dead from err
            raise err
        new = refreshed.image_urls[index] if index < len(refreshed.image_urls) else None
        if new is None or (new == url and dead is not None):
            raise dead or _expired(task, stem, "the gateway lists no link for it any more")
        log.info("result %s of task %s: its link died; trying the one it has now", stem, task.id)
        return (yield from self._fetch(refreshed, new, dest_dir, stem, overwrite, limits))

    def _limits(self, max_bytes: object, timeout: object) -> tuple[int, float]:
        """The caller's ``max_bytes`` and ``timeout`` (default: the client's), checked."""
        return _fetch_settings(
            max_bytes, self.calls.settings.timeout if timeout is None else timeout
        )

    def _refreshed(self) -> Flow[Task]:
        """The task asked for again, once for all its files."""
        if self.refreshed is None:
            task = self.task
            try:
                latest = yield from self.requery(task)
            except NotFoundError as err:  # the task is gone; other errors say nothing of it
                why = f"the gateway no longer knows the task: {err.message}"
                raise _expired(task, "", why) from err
            if latest.status is not TaskStatus.SUCCEEDED:
                raise _expired(task, "", f"the task is now {latest.status.value}")
            self.refreshed = latest
        return self.refreshed

    def _fetch(
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
        # Never the link itself (its query may hold a signature), nor a key put in its host.
        host = blank(link_origin(url), (self.calls.settings.api_key,))

        def read(outcome: Fetched | TransportFailure) -> DownloadedFile | BinaryIO:
            if isinstance(outcome, TransportFailure):
                raise surfaces.transport_error(task.surface, outcome, host=host) from outcome.error
            if outcome.file is not None:
                file, key = outcome.file, self.calls.settings.api_key
                blank_when_shown(file, [file.url], (key,))  # as read_task does a task's
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
                    status_code=outcome.status,
                    code=NOT_AN_IMAGE,
                    surface=task.surface,
                )
            if outcome.status in EXPIRED_STATUSES:
                why = f"its link answered HTTP {outcome.status}"
                raise _expired(task, stem, why, outcome.status)
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
            # A closed client is the client's state, not this result's: said as it is.
            if isinstance(err, (ResultExpiredError, DownloadError, ClientClosedError)):
                return err
            return DownloadError(
                f"could not download result {stem} of task {task.id}: {err.message}",
                status_code=err.status_code,
                code=NOT_AN_IMAGE if err.code == NOT_AN_IMAGE else None,
                surface=task.surface,
            )

        return self.calls.attempts(
            lambda: Fetch(url, dest_dir, stem, overwrite, timeout, max_bytes), read, give_up
        )


def _check_downloadable(task: object) -> None:
    """A task whose results can be fetched: a :class:`Task`, checked (it may come from stored
    data, and its id names files), succeeded, with links."""
    if not isinstance(task, Task):
        rule = "must be a Task (for a task id, call get(task_id) and download that)"
        raise_violations([rules.Violation("task", rule, "invalid_task")])
    assert isinstance(task, Task)
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
    """The error of a result (``stem``) or of all a task's results (no stem) past retention."""
    what = f"result {stem} of task {task.id}" if stem else f"the results of task {task.id}"
    return ResultExpiredError(
        f"{what} can no longer be downloaded ({why}); its retention window has passed",
        status_code=status,
        code=reasons.RESULT_EXPIRED.code,
        surface=task.surface,
    )


def _fetch_settings(max_bytes: object, timeout: object) -> tuple[int, float]:
    """``max_bytes`` and ``timeout`` checked, before anything is sent."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        rule = rules.Violation("max_bytes", "must be an integer >= 1", "invalid_max_bytes")
        raise_violations([rule])
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise_violations([rules.Violation("timeout", "must be seconds > 0", "invalid_timeout")])
    assert isinstance(max_bytes, int)
    assert isinstance(timeout, (int, float))
    return max_bytes, float(timeout)


def _checked_prefix(prefix: object) -> str:
    """A file-name prefix: letters, digits, "-" and "_" only, so it never leaves the folder nor
    hides a file."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        rule = "must be at most 64 letters, digits, '-' or '_'"
        raise_violations([rules.Violation("prefix", rule, "invalid_prefix")])
    assert isinstance(prefix, str)
    return prefix
