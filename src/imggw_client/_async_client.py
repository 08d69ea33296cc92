"""The ``AsyncClient``: it performs the core's actions with the I/O of ``_io_async``.

This file is the single source of both clients: ``scripts/unasync.py`` generates the other
from it. Every way in which the two differ lives in ``_io_async`` (and its twin): edit this
file, then run the script."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, TypeVar, cast

import httpx

from . import _io_async as _io
from . import _logs, _telemetry, _transport
from ._base_client import (
    COMPLETIONS_IN_FLIGHT,
    DEFAULT_DOWNLOAD_CONCURRENCY,
    DEFAULT_MAX_RETRIES,
    DEFAULT_POLL,
    DEFAULT_TIMEOUT,
    DEFAULT_WAIT_TIMEOUT,
    RESENDS_IN_FLIGHT,
    BaseClient,
    journaled,
    log_forgotten,
    log_resend,
    unique,
    wait_deadline,
)
from ._core import wire
from ._core.budget import Budget, BudgetService, RemoteBudget
from ._core.completions import Completions, stand_in
from ._core.config import (
    PollPolicy,
    RateLimit,
    RetryPolicy,
    Settings,
    key_forgotten,
    resolve_settings,
)
from ._core.exceptions import (
    ConfigurationError,
    ImggwError,
    ResultExpiredError,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from ._core.interruptions import interrupt
from ._core.models import DownloadedFile, Submission, Task, raise_violations
from ._core.rules import AspectRatio, Resolution, Violation
from ._core.silence import answered
from ._core.spec import Surface
from ._core.wire import Flow
from ._download import DEFAULT_MAX_BYTES, Sink, check_concurrency, check_dest_dir, first_error
from ._telemetry import Watch

if TYPE_CHECKING:
    import httpx2

    from ._journal.journal import Journal, JournalEntry

T = TypeVar("T")

__all__ = ["AsyncClient"]


class AsyncClient(BaseClient[httpx.AsyncClient]):
    """The asynchronous imggw client: the same API as :class:`Client`, awaited.

    ``api_key`` and ``base_url`` fall back to ``IMGGW_API_KEY`` and ``IMGGW_BASE_URL``. Pass
    ``http_client=`` to use your own ``httpx.AsyncClient`` or ``httpx2.AsyncClient`` (proxies,
    mounts, the one openai-python 3 uses); it is not closed by :meth:`close`. Or pass
    ``transport=`` (an ``httpx.AsyncBaseTransport``): the client makes its own HTTP client over
    it, and closes both.
    Share one client between tasks.

    ``timeout`` bounds each request: seconds from sending it to its last byte, or an
    ``httpx.Timeout`` (each phase as httpx bounds it, the whole request by its largest limit).
    ``default_headers`` go on every request to the gateway (never on result downloads, which
    go to other hosts); they may not set ``Authorization`` or ``Idempotency-Key``, which the
    SDK sets (:class:`ConfigurationError`).

    ``journal=`` (a path or a :class:`~imggw_client.tracking.Journal`; default
    ``IMGGW_JOURNAL``, else none; ``False``: none whatever the environment says) records every
    submit before its request leaves, and what becomes of its task: see :meth:`unfinished`.
    ``idempotency_window`` (seconds; default ``IMGGW_IDEMPOTENCY_WINDOW``, else 86400) is how
    long the gateway remembers an idempotency key: a journaled submit whose outcome is unknown
    and that was first sent longer ago than that is never sent again on its own.

    An ``AsyncClient`` may be used under one event loop after another (several
    ``asyncio.run()`` calls), or several at once (threads): each loop gets an HTTP client of
    its own, closed on that loop as its run ends. A caller's own ``http_client``, or a
    transport that pools connections (``httpx.AsyncHTTPTransport``), belongs to its loop: using
    it under another raises :class:`ConfigurationError` before anything is sent.

    Example::

        async with AsyncClient() as client:
            task = await client.generate("a lighthouse at dusk", aspect_ratio="16:9")
            files = await client.download(task, "out/")
    """

    _http_type = httpx.AsyncClient
    _transport_type = httpx.AsyncBaseTransport
    _defer_journal = _io.DEFER_JOURNAL

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        surface: Surface = "beta",
        default_headers: Mapping[str, str] | None = None,
        timeout: float | httpx.Timeout | httpx2.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        retry: RetryPolicy | None = None,
        poll: PollPolicy = DEFAULT_POLL,
        rate_limit: RateLimit | None = None,
        http_client: httpx.AsyncClient | httpx2.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        journal: Journal | str | os.PathLike[str] | Literal[False] | None = None,
        idempotency_window: float | None = None,
    ) -> None:
        settings = resolve_settings(
            api_key,
            base_url,
            surface=surface,
            timeout=timeout,
            max_retries=max_retries,
            retry=retry,
            poll=poll,
            rate_limit=rate_limit,
            default_headers=default_headers,
            idempotency_window=idempotency_window,
        )
        super().__init__(settings, http_client=http_client, transport=transport, journal=journal)
        self._sleep = _io.sleep

    def _own_budget(self, settings: Settings) -> Budget | RemoteBudget:
        if settings.rate_limit.store is not None:  # one budget with other processes
            return RemoteBudget(_io.store_budget(settings))
        return super()._own_budget(settings)

    @staticmethod
    def make_http_client(**options: Any) -> httpx.AsyncClient:
        """A new ``httpx.AsyncClient`` (``options`` as for httpx), made as this client makes
        its own: for an ``http_client=`` of yours (headers, proxies, limits) that keeps what
        the client's own has (``Client``'s has a network layer that ends each whole request
        within its timeout, however slowly a server answers). Yours to close.

        Example::

            http = AsyncClient.make_http_client(headers={"User-Agent": "my-app/2.1"})
            client = AsyncClient(http_client=http)
        """
        return _io.new_http(**options)

    async def submit(
        self,
        prompt: str | UnknownOutcomeError,
        *,
        aspect_ratio: AspectRatio = "auto",
        resolution: Resolution = "1k",
        surface: Surface | None = None,
        idempotency_key: str | None = None,
        validate: bool = True,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Submission:
        """Submits one request and returns its task id and idempotency key.

        Every retry reuses one idempotency key, so a lost response never creates a second task.
        If retries run out while the outcome is unknown, :class:`UnknownOutcomeError` carries
        the key: ``submit(err)`` sends that submit again (its request, key and surface; the
        other arguments are not used), and the gateway replays the task it may have made. A
        submit cancelled or interrupted after its request left names its key in a note on the
        exception and in one WARNING on the ``imggw_client`` logger. ``extra_headers`` go on
        this call's requests, over the client's ``default_headers`` (not ``Authorization`` nor
        ``Idempotency-Key``: :class:`RequestValidationError`, before anything is sent).

        Example::

            sub = await client.submit("a red fox in snow", aspect_ratio="3:2", resolution="2k")
            try:
                sub = await client.submit("a red fox in snow")
            except UnknownOutcomeError as err:
                sub = await client.submit(err)    # replayed, never billed twice
        """
        resend = prompt if isinstance(prompt, UnknownOutcomeError) else None
        with self._operation("imggw.submit", resend.surface if resend else surface) as watch:
            if resend is not None:
                flow = self._flows.resubmit(
                    resend,
                    surface=surface,
                    idempotency_key=idempotency_key,
                    extra_headers=extra_headers,
                )
            else:
                flow = self._flows.submit(
                    cast(str, prompt),
                    aspect_ratio=aspect_ratio,
                    resolution=resolution,
                    surface=surface,
                    idempotency_key=idempotency_key,
                    validate=validate,
                    extra_headers=extra_headers,
                )
            return await self._run(flow, watch=watch)

    async def get(
        self,
        task_id: str,
        *,
        surface: Surface | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Task:
        """Queries a task once (transient failures are retried). ``extra_headers`` go on this
        call's request, over the client's ``default_headers``.

        Example::

            task = await client.get(sub.task_id, extra_headers={"X-Request-Id": "r-7"})
        """
        with self._operation("imggw.get", surface) as watch:
            flow = self._flows.get(task_id, surface=surface, extra_headers=extra_headers)
            return await self._run(flow, watch=watch)

    async def wait(
        self,
        task_id_or_submission: str | Submission | Task | WaitTimeoutError,
        *,
        surface: Surface | None = None,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        on_update: _io.OnUpdate | None = None,
        extra_headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Task:
        """Polls until the task succeeds (returned) or fails (:class:`TaskFailedError`).

        Past ``wait_timeout`` seconds it raises :class:`WaitTimeoutError`, which is not a
        failure: ``wait(err)`` waits again, on the task's own surface (a :class:`Submission`
        or :class:`Task` carries its surface too; ``surface=`` is for a bare task id).
        ``on_update(task)`` sees every new status or progress (a coroutine it returns is awaited).
        ``extra_headers`` go on each of its queries. A wait never submits. ``timeout=`` is the
        deprecated name of ``wait_timeout`` (a :class:`DeprecationWarning`); each query is
        bounded by the client's own ``timeout``.

        Example::

            task = await client.wait(sub, wait_timeout=900, on_update=lambda t: print(t.progress))
            try:
                task = await client.generate("a lighthouse", surface="alpha", wait_timeout=60)
            except WaitTimeoutError as err:
                task = await client.wait(err)     # asks alpha again
        """
        deadline = wait_deadline(wait_timeout, timeout)
        with self._operation("imggw.wait", surface) as watch:
            return await self._run(
                self._flows.wait(
                    task_id_or_submission,
                    surface=surface,
                    timeout=deadline,
                    extra_headers=extra_headers,
                ),
                on_update,
                watch=watch,
            )

    async def generate(
        self,
        prompt: str,
        *,
        aspect_ratio: AspectRatio = "auto",
        resolution: Resolution = "1k",
        surface: Surface | None = None,
        idempotency_key: str | None = None,
        validate: bool = True,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        on_update: _io.OnUpdate | None = None,
        on_submit: _io.OnSubmit | None = None,
        extra_headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Task:
        """Submits and waits: :meth:`submit` then :meth:`wait` (up to ``wait_timeout``
        seconds; ``timeout=`` is its deprecated name). ``on_submit(submission)`` is called as
        soon as the submit answers, before the wait, as ``on_update`` is: the place to keep
        the task id where your application keeps its own state. ``extra_headers`` go on the
        submit and on every query of the wait.

        Example::

            task = await client.generate("a lighthouse at dusk", aspect_ratio="16:9",
                                         resolution="2k", wait_timeout=900,
                                         on_submit=lambda sub: print(sub.task_id))
        """
        deadline = wait_deadline(wait_timeout, timeout)
        with self._operation("imggw.generate", surface) as watch:
            return await self._run(
                self._flows.generate(
                    prompt,
                    aspect_ratio=aspect_ratio,
                    resolution=resolution,
                    surface=surface,
                    idempotency_key=idempotency_key,
                    timeout=deadline,
                    validate=validate,
                    extra_headers=extra_headers,
                ),
                on_update,
                watch=watch,
                on_submit=on_submit,
            )

    async def download(
        self,
        task: Task,
        dest_dir: str | Path,
        *,
        overwrite: bool = False,
        concurrency: int = DEFAULT_DOWNLOAD_CONCURRENCY,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float | None = None,
        prefix: str = "",
    ) -> list[DownloadedFile]:
        """Saves every result of a succeeded task into ``dest_dir`` as ``<task id>-<index>.<ext>``.

        Each file is streamed to a temp file, checked against its Content-Length (without one,
        a PNG, JPEG, GIF or WebP must end where its format says); hashed (sha256) and renamed
        into place atomically. The API key is never sent to result URLs. A file already there
        is kept unless ``overwrite=True``: with the result's very bytes it is reported saved
        (downloading twice is harmless), other bytes raise :class:`DownloadError` (code
        ``FILE_EXISTS``). A link past retention raises :class:`ResultExpiredError`.
        A file larger than ``max_bytes`` (default 128 MiB) is refused; ``timeout`` (default:
        the client's) bounds each attempt at a file, however slowly its bytes come. Up to
        ``concurrency`` files download at once; if one fails, the others still finish and the
        first error is raised. ``prefix`` (letters, digits, ``-``, ``_``) starts every file's
        name: tasks of both surfaces may share an id and a folder.

        Example::

            for f in await client.download(task, "out/"):
                print(f.path, f.sha256)
        """
        flows = self._flows.downloads(
            task,
            check_dest_dir(dest_dir),
            overwrite=overwrite,
            max_bytes=max_bytes,
            timeout=timeout,
            prefix=prefix,
        )
        limit = check_concurrency(concurrency)
        with self._operation("imggw.download", getattr(task, "surface", None)) as watch:
            run = functools.partial(self._run_catching, watch=watch)
            try:
                files = first_error(await _io.map_concurrently(run, flows, limit))
            except ResultExpiredError:
                await self._run(self._flows.expired(task))
                raise
            await self._run(self._flows.saved(task, files))
            watch.result(task)
            return files

    async def read(
        self,
        task: Task,
        index: int = 0,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float | None = None,
    ) -> bytes:
        """The bytes of result ``index`` of a succeeded task, for code that sends the image
        on (an HTTP response, an upload) rather than saving it. Fetched and verified exactly
        as :meth:`download` does (its Content-Length, or where a PNG, JPEG, GIF or WebP says
        it ends; ``max_bytes``; ``timeout``, default the client's, for each attempt; a dead
        link asked for again, :class:`ResultExpiredError` only when the fresh one fails too),
        without the API key, and never written where you would see it. For a large image,
        :meth:`open` holds it out of memory.

        Example::

            png = await client.read(task)                 # the first result
            assert png.startswith(b"\\x89PNG")
        """
        async with self.open(task, index, max_bytes=max_bytes, timeout=timeout) as stream:
            return await _io.run_sync(stream.read)

    @contextlib.asynccontextmanager
    async def open(
        self,
        task: Task,
        index: int = 0,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float | None = None,
    ) -> AsyncIterator[BinaryIO]:
        """A context manager yielding result ``index`` of a succeeded task as a binary
        stream (seekable, at its start), verified whole before the first byte is handed out,
        exactly as :meth:`read` is. Up to 8 MiB are held in memory, a larger image in an
        anonymous temporary file, deleted when the block ends.

        Example::

            async with client.open(task, 0) as image:
                head = image.read(8)                      # a seekable stream, not a file
                image.seek(0)
        """
        stream = await self._held(task, index, max_bytes=max_bytes, timeout=timeout)
        try:
            yield stream
        finally:
            stream.close()

    async def _held(
        self, task: Task, index: int, *, max_bytes: int, timeout: float | None
    ) -> BinaryIO:
        flow = self._flows.opened(task, index, max_bytes=max_bytes, timeout=timeout)
        with self._operation("imggw.download", getattr(task, "surface", None)) as watch:
            try:
                stream = await self._run(flow, watch=watch)
            except ResultExpiredError:
                await self._run(self._flows.expired(task))
                raise
            watch.result(task)
            return stream

    async def as_completed(
        self,
        items: Iterable[Submission | Task | str],
        *,
        timeout: float | None = None,
        errors: Literal["yield", "raise"] = "yield",
    ) -> AsyncIterator[Task]:
        """Waits on many tasks at once and yields each :class:`Task` as soon as it is terminal
        (succeeded or failed: a failed task is yielded, not raised), in the order they finish.
        ``items`` are submissions, tasks or task ids (on the client's surface); each task
        yielded carries its item's ``request`` and ``idempotency_key``. Every wait shares the
        client's budget and what it learned of its tasks' durations; the queries most likely
        to find a task finished go first. Past ``timeout`` seconds (default: no limit) it
        raises :class:`WaitTimeoutError`: its message names the tasks still running, and
        ``still_running`` holds every one's id: wait on them again.

        One task's trouble is that task's outcome: a task the gateway no longer knows
        (``task_not_found``), or whose query it refuses, is yielded as failed, with that code
        and message in its ``error`` and nothing in its ``raw`` (and one WARNING naming its id
        and key), while the other waits go on. Only an error of the whole client ends the
        call: its key refused (:class:`AuthenticationError`), the client closed.
        ``errors="raise"`` ends the call on the first task's error instead (the error raised
        once the tasks finished meanwhile are yielded).

        Example::

            subs = [await client.submit(p) for p in prompts]
            async for task in client.as_completed(subs, timeout=900):
                if task.status is TaskStatus.SUCCEEDED:
                    await client.download(task, "out/")
                else:
                    print(task.id, task.idempotency_key, task.error)
        """
        if errors not in ("yield", "raise"):
            rule = "must be 'yield' (a task's error is its outcome) or 'raise'"
            raise_violations([Violation("errors", rule, "invalid_errors")])
        wait = math.inf if timeout is None else timeout
        items = unique(items, self.surface)
        flows = [self._flows.wait(item, surface=None, timeout=wait) for item in items]
        known = [stand_in(item, self.surface) for item in items]
        yield_errors = errors == "yield"
        completions = Completions(flows, self._flows.clock, known=known, yield_errors=yield_errors)
        with self._operation("imggw.as_completed", None) as watch:
            try:
                while (step := completions.due()) is not None:
                    if isinstance(step, float):
                        await self._sleep(step)
                    else:
                        perform = functools.partial(self._perform_for, watch=watch)
                        limit = COMPLETIONS_IN_FLIGHT
                        completions.give(await _io.map_concurrently(perform, step, limit))
                    for task in completions.finished():
                        yield task
                for task in completions.finished():
                    yield task
                error = completions.error()
                if error is not None:
                    raise error
            finally:
                completions.close()
                await _io.give_back(self._flows.budget)

    async def unfinished(self, *, resend_expired_keys: bool = False) -> list[Submission]:
        """Every task of this client's journal (this key, this gateway) that still needs a
        wait or a download, as submissions to wait on (:meth:`as_completed`), each with its
        ``request``. A submit whose outcome was never read (the process was killed while it
        was in flight) is sent again with its idempotency key first, several at once under
        the client's budget: the gateway replays the task it made, never bills a second one.
        One that is still unanswered stays in the journal for the next call; one the gateway
        refuses (it made no task) leaves it. Without a journal: ``[]``.

        A submit first sent longer ago than :attr:`idempotency_window` is not sent again: the
        gateway may have forgotten its key, and would bill a second task. It stays in the
        journal, and one WARNING names its key. ``resend_expired_keys=True`` sends those too,
        each of which may then be billed twice.

        Example::

            async with AsyncClient(journal="state/imggw.sqlite") as client:
                async for task in client.as_completed(await client.unfinished()):
                    if task.status is TaskStatus.SUCCEEDED:
                        await client.download(task, "out/")
        """
        self._check_open()
        if self._journal is None:
            return []
        entries = await _io.run_sync(self._open_entries)
        now, window = self._flows.wall(), self.idempotency_window
        found: list[Submission | None] = []
        unknown: list[tuple[int, JournalEntry]] = []
        for entry in entries:
            if entry.task_id is not None:
                found.append(journaled(entry))
            elif resend_expired_keys or not key_forgotten(entry.created_at, window, now):
                unknown.append((len(found), entry))
                found.append(None)
            else:
                log_forgotten(entry, window)
        lost = [entry for _, entry in unknown]
        resent = await _io.map_concurrently(self._resend, lost, RESENDS_IN_FLIGHT)
        for (index, _), outcome in zip(unknown, resent, strict=True):
            if isinstance(outcome, BaseException):  # not a row's: ends the call, all sent
                raise outcome
            found[index] = outcome
        return [sub for sub in found if sub is not None]

    async def _resend(self, entry: JournalEntry) -> Submission | Exception | None:
        """A journaled submit of unknown outcome sent again with its key: its submission, or
        None when it did not get back (logged; its row stays, or goes when refused)."""
        lost = UnknownOutcomeError(
            "a journaled submit's outcome is unknown",
            idempotency_key=entry.idempotency_key,
            request=entry.request,
            surface=entry.surface,
        )
        try:
            return await self.submit(lost)
        except ImggwError as err:  # still unanswered: kept; refused: the journal drops it
            log_resend(entry.idempotency_key, err)
            return None
        except Exception as exc:  # raised once every other resend ended (no group of errors)
            return exc

    def share_budget(self, service: BudgetService) -> None:
        """Makes every request of this client (and of the ``with_options`` copies made from
        now on) wait for a slot of a request budget held elsewhere and shared with other
        processes: one budget for a whole run on many machines, as the Dask driver of
        ``imggw_client.batch`` holds on its scheduler. ``service`` is a
        :class:`BudgetService`, whose methods this client awaits. Its ceilings are the
        holder's; this client's own ``rate_limit`` no longer applies.

        Example::

            class Unpaced:                 # a BudgetService of yours: every request goes now
                async def reserve(self, kind: str) -> tuple[Hashable, float]:
                    return kind, 0.0
                async def wait_time(self, ticket: Hashable) -> float:
                    return 0.0
                async def release(self, ticket: Hashable) -> None: ...
                async def finished(self, ticket, *, limited, retry_after, backoff) -> None: ...

            client.share_budget(Unpaced())   # from now on every request waits for a slot
        """
        self._flows.budget = RemoteBudget(_io.checked_service(service))

    async def close(self) -> None:
        """Closes the HTTP client if this client created it. Calls made after it, or cut short
        by it from another task, raise :class:`ClientClosedError` (a submit whose outcome is
        unknown: :class:`UnknownOutcomeError` with its key)."""
        self._closed = True
        if self._owns_http:
            await _io.close_http(self._conn)
        if self._owns_budget:
            await _io.close_budget(self._flows.budget)
        if not self._copy and self._owns_journal and self._journal is not None:
            self._journal.close()
        self._watching()  # its key is no more this client's to blank

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------------ driver

    async def _run(
        self,
        flow: Flow[T],
        on_update: _io.OnUpdate | None = None,
        *,
        watch: Watch = _telemetry.NULL,
        on_submit: _io.OnSubmit | None = None,
    ) -> T:
        # Before the flow takes a step: a journaled call records before it sends, and a closed
        # client's must say so (ClientClosedError), not reach its closed journal. Its requests
        # and downloads say so as they are sent.
        if self._journal is not None:
            self._check_open()
        if on_update is not None:
            _io.check_callback(on_update, "on_update")
        if on_submit is not None:
            _io.check_callback(on_submit, "on_submit")
        outcome: Any = None
        while True:
            try:
                action = flow.send(outcome)
            except StopIteration as done:
                watch.result(done.value)
                return done.value  # type: ignore[no-any-return]
            try:
                outcome = await self._perform(action, on_update, watch, on_submit)
            except BaseException as exc:  # cancelled, closed, interrupted: the flow gives back
                interrupt(flow, exc)  # its place, and a submit names its key on exc
                await _io.give_back(self._flows.budget)
                raise

    async def _run_catching(
        self, flow: Flow[T], *, watch: Watch = _telemetry.NULL
    ) -> T | BaseException:
        try:
            return await self._run(flow, watch=watch)
        except Exception as exc:
            return exc

    async def _perform_for(self, step: tuple[int, wire.Action], *, watch: Watch) -> tuple[int, Any]:
        index, action = step
        return index, await self._perform(action, None, watch)

    async def _perform(
        self,
        action: wire.Action,
        on_update: _io.OnUpdate | None,
        watch: Watch,
        on_submit: _io.OnSubmit | None = None,
    ) -> Any:
        if isinstance(action, wire.Send):
            return await self._send(action)
        if isinstance(action, wire.Observe):
            watch.observe(action)
            return None
        if isinstance(action, wire.Sleep):
            await self._sleep(action.seconds, action.arm)
        elif isinstance(action, wire.Record):
            try:
                await _io.record(self._journal, action.event, self.journal_scope)
            except ConfigurationError:
                # Closed since the call began (by another thread or task), and its journal
                # with it: what the caller did, as any call on a closed client says.
                self._check_open()
                raise
        elif isinstance(action, wire.Answered):
            if on_submit is not None:
                await _io.notify(on_submit, action.submission)
        elif isinstance(action, wire.Notify):
            if on_update is not None:
                await _io.notify(on_update, action.task)
        elif isinstance(action, wire.Fetch):
            return await self._fetch(action)
        else:
            return await self._budget_call(action)
        return None

    async def _budget_call(self, action: wire.Pace | wire.Paced) -> Any:
        budget = self._flows.budget
        assert isinstance(budget, RemoteBudget), "only a shared budget yields these"
        service = cast(BudgetService, budget.service)  # share_budget checked its kind
        if isinstance(action, wire.Pace):
            if action.ticket is None:
                return await service.reserve(action.kind)
            return action.ticket, await service.wait_time(action.ticket)
        ticket: Any = action.ticket
        if not action.sent:
            await service.release(ticket)
        else:
            await service.finished(
                ticket,
                limited=action.limited,
                retry_after=action.retry_after,
                backoff=action.backoff,
            )
        return None

    async def _send(self, send: wire.Send) -> wire.Reply | wire.TransportFailure:
        closed = self._closed_failure()
        if closed is not None:
            return closed
        http = await _io.claim(self._conn)  # the one to send with: see _io.claim
        request = _transport.build_request(http, self._settings, send, self._agent)
        body = _transport.Body()
        status: int | None = None
        started = time.monotonic()
        self._silence.asked(started)
        try:
            with _io.bounded(send.timeout) as deadline:
                # Never followed, whatever the caller's HTTP client says: a gateway's 3xx is its
                # answer, not a door to another host (or to this machine) for a paid request.
                response = await http.send(request, stream=True, follow_redirects=False)
                try:
                    async for chunk in response.aiter_bytes():
                        body.add(chunk)
                        _io.check_deadline(deadline)
                finally:
                    await response.aclose()
            status = response.status_code
        except Exception as exc:
            return _transport.to_failure(exc) or self._failure(exc)
        finally:
            ended = time.monotonic()
            self._silence.heard(ended, answer=answered(status))
        return _transport.to_reply(response, body.content, ended - started)

    async def _fetch(self, fetch: wire.Fetch) -> wire.Fetched | wire.TransportFailure:
        closed = self._closed_failure()
        if closed is not None:
            return closed
        http = await _io.claim(self._conn)
        sink = Sink(fetch)
        try:
            with _io.bounded(fetch.timeout) as deadline:
                request = _transport.download_request(http, self._settings, fetch, self._agent)
                link = request.url
                # Redirects are followed here, one hop at a time, so that each is looked at
                # before anything is sent where it leads (``_transport.redirect``).
                for _hop in _transport.hops(http):
                    with _logs.hiding(request.url):  # its query in no log line
                        # auth=None: an auth= on the caller's client is for the gateway, never here.
                        response = await http.send(
                            request, stream=True, follow_redirects=False, auth=None
                        )
                        try:
                            following = _transport.redirect(http, fetch, link, response)
                            if following is None:
                                if response.status_code != 200:
                                    return wire.Fetched(response.status_code)
                                async for chunk in response.aiter_bytes():
                                    sink.write(chunk)
                                    if sink.too_large:
                                        return wire.Fetched(200, too_large=True)
                                    _io.check_deadline(deadline)
                                return await _io.run_sync(sink.finish, response.headers)
                        finally:
                            await response.aclose()
                    request = following
                raise _transport.too_many_redirects(http, request)
        except ImggwError:
            raise  # the disk or a refused redirect, not the network: never retried as a fault
        except Exception as exc:
            return _transport.to_failure(exc) or self._failure(exc)
        finally:
            sink.discard()
