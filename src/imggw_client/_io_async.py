"""What ``AsyncClient`` does its I/O with: every way in which it differs from ``Client``.

``_client.py`` is generated from ``_async_client.py`` (``scripts/unasync.py``), with this
module's name turned into ``_io_sync``: the two modules offer the same names, awaited here and
blocking there, so that the client itself is one text. Under asyncio or trio (through anyio).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
import httpx

from ._core.budget_service import GIVE_BACK_TIMEOUT, BudgetService
from ._core.config import Settings
from ._core.exceptions import ConfigurationError, RequestValidationError
from ._core.models import Submission, Task
from ._files import StorageError
from ._transport import shared_tls

if TYPE_CHECKING:
    from ._journal.journal import Journal, Scope
    from ._transport import Connection

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("imggw_client")

OnUpdate = Callable[[Task], Any]  # may return an awaitable, which is awaited
OnSubmit = Callable[[Submission], Any]  # the same

Arm = Callable[[Callable[[], object]], float]  # a budget's wait: see ``wire.Sleep``


async def sleep(seconds: float, arm: Arm | None = None) -> None:
    """Sleeps ``seconds``; or, given ``arm``, what it returns or until the wake it arms comes
    (from any thread)."""
    if arm is None:
        await anyio.sleep(seconds)
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio: no wake from another thread here; the told wait is slept
        await anyio.sleep(seconds)
        return
    woken = loop.create_future()

    def wake() -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(_settle, woken)

    seconds = arm(wake)
    if seconds <= 0:  # news came already: asked again, after the loop's other tasks had a turn
        await asyncio.sleep(0)
        return
    # asyncio.wait times out without cancelling this task (wait_for would, from 3.12), which
    # anyio's cancel scopes around a request must not see.
    try:
        await asyncio.wait([woken], timeout=seconds)
    finally:
        woken.cancel()


def _settle(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


def new_http(**options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(**shared_tls(options))


class bounded:  # used as a function, as _io_sync's is
    """Ends the block (TimeoutError) ``seconds`` from now, however slowly bytes come: what
    ``anyio.fail_after`` does, without its generator (it wraps every request)."""

    __slots__ = ("_scope",)

    def __init__(self, seconds: float) -> None:
        self._scope = anyio.CancelScope(deadline=_now() + seconds)

    def __enter__(self) -> anyio.CancelScope:
        return self._scope.__enter__()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:  # as fail_after's is typed: mypy then reads no swallowed error here
        swallowed = self._scope.__exit__(kind, exc, tb)
        if self._scope.cancelled_caught and _now() >= self._scope.deadline:
            raise TimeoutError
        return swallowed


def _now() -> float:
    """``anyio.current_time()``: under asyncio its loop's clock, as anyio reads it, without
    anyio's lookup of the running library (through sniffio) at every request."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:  # not asyncio: anyio's other backend
        return anyio.current_time()


def check_deadline(scope: anyio.CancelScope) -> None:
    """Between chunks of a body: nothing to do, the cancel scope ends the request on time."""


def check_callback(callback: object, field: str) -> None:
    """An ``on_update`` or ``on_submit``: a function (async or not), refused before a request
    is sent if it is anything else."""
    if not callable(callback):
        raise RequestValidationError(field, f"must be callable, not {type(callback).__name__}")


async def notify(callback: Callable[[Any], Any], value: object) -> None:
    result = callback(value)
    if inspect.isawaitable(result):
        await result


async def run_sync(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in a worker thread, so that a slow disk (an fsync) holds up no other
    task of the event loop."""
    return await anyio.to_thread.run_sync(func, *args)


# A journal an AsyncClient opens from a path is opened on first use, in a worker thread: an
# AsyncClient made inside a coroutine never waits for the file on its event loop.
DEFER_JOURNAL = True


async def record(journal: Journal | None, event: object, scope: Scope) -> None:
    """Commits a journal event before the flow goes on: on the event loop's thread when that
    takes no waiting (a hop to a worker thread costs more than the write, BENCHMARKS.md); in a
    worker thread when another writer holds the file or a checkpoint (which syncs) is due,
    or the file is not open yet, where the journal's busy timeout waits and no other task of
    the loop is held up. A write that fails after the submit's request left is the journal's
    to report: the call's answer stands."""
    if journal is None:
        return
    try:
        if not journal.try_record(event, scope):
            await run_sync(journal.record, event, scope)
    except (StorageError, ConfigurationError) as err:
        if not journal.unrecorded(event, err):
            raise


async def map_concurrently(
    func: Callable[[T], Awaitable[R]], items: Sequence[T], limit: int
) -> list[R]:
    """``func`` of every item, at most ``limit`` at once (tasks); results in the items' order."""
    limiter = anyio.CapacityLimiter(limit)
    results: dict[int, R] = {}

    async def run(index: int) -> None:
        async with limiter:
            results[index] = await func(items[index])

    async with anyio.create_task_group() as group:
        for index in range(len(items)):
            group.start_soon(run, index)
    return [results[index] for index in range(len(items))]


def current_loop() -> object:
    """The running event loop: asyncio's, or trio's token."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: anyio's other backend
        return importlib.import_module("trio").lowlevel.current_trio_token()


async def claim(conn: Connection[httpx.AsyncClient]) -> httpx.AsyncClient:
    """The HTTP client of the running event loop (see ``Connection.claim``). One made for this
    loop is closed on it when the loop ends: its connections die with the loop, and one left
    to the garbage collector is a socket open until then and a ResourceWarning after."""
    loop = current_loop()
    http, made = conn.claim(loop)
    if made:
        guard = LoopEnd(conn, loop, http)
        await guard.start()
        conn.keep(loop, guard)
    return http


async def close_http(conn: Connection[httpx.AsyncClient]) -> None:
    """Closes the HTTP clients a client made: the running loop's now; another thread's loop's
    on that loop, soon (if it runs; else at its end); a closed loop's, never (nothing can)."""
    conn.shut = True
    here = current_loop()
    for loop, guard in list(conn.guards.items()):
        if loop is here:
            await guard.close()
        else:
            guard.close_soon()
    if conn.loop in (None, here) and not conn.http.is_closed:  # unused yet, or not replaceable
        await conn.http.aclose()


class LoopEnd:
    """Closes the HTTP client made for one event loop, on that loop, as the loop ends.

    An async generator started on the loop: ``asyncio.run`` (``shutdown_asyncgens``) and
    ``trio.run`` close every one still open before their loop closes, on the loop, after the
    loop's tasks ended; one collected while its loop runs is closed there by the loop's
    finalizer. Public hooks of both, so no registry of loops and no private API."""

    def __init__(
        self, conn: Connection[httpx.AsyncClient], loop: object, http: httpx.AsyncClient
    ) -> None:
        self.loop = loop
        self._gen = _closing(weakref.ref(conn), loop, http, os.getpid())

    async def start(self) -> None:
        """Started on the loop: the loop now knows it, and closes it as it ends."""
        await self._gen.asend(None)

    async def close(self) -> None:
        """Closes the HTTP client now (the client is closed on this very loop)."""
        await self._gen.aclose()

    def close_soon(self) -> None:
        """Closes the HTTP client on its loop, which runs in another thread: without waiting
        for it (that loop may be busy for long). A loop that does not run closes it at its
        end."""
        loop = self.loop
        if not isinstance(loop, asyncio.AbstractEventLoop) or not loop.is_running():
            return  # trio's, or not running: its run's end closes it
        closing = self._gen.aclose()
        try:
            asyncio.run_coroutine_threadsafe(closing, loop)
        except RuntimeError:  # closed meanwhile: nothing can close it now
            closing.close()

    def dropped(self) -> None:
        """Let go by its connection. Under a loop that still runs, the loop closes it once it
        is collected; under one closed without ending its run (``loop.close()`` alone),
        nothing can: it is ended here, so that its collection asks nothing of that loop (which
        would be an "Event loop is closed" error at exit)."""
        if not _loop_closed(self.loop):
            return
        closing = self._gen.aclose()
        with contextlib.suppress(StopIteration, RuntimeError):
            closing.send(None)
        closing.close()


async def _closing(
    conn: weakref.ref[Connection[httpx.AsyncClient]],
    loop: object,
    http: httpx.AsyncClient,
    pid: int,
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        connection = conn()
        if connection is not None:
            connection.ended(loop, http)
        # Never the parent's connections in a forked child, nor a closed loop's.
        if os.getpid() == pid and not _loop_closed(loop):
            # Shielded: trio ends its generators in a cancelled scope. What fails to close a
            # connection of a loop that is ending is news to no one.
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await http.aclose()


def _loop_closed(loop: object) -> bool:
    return isinstance(loop, asyncio.AbstractEventLoop) and loop.is_closed()


def checked_service(service: BudgetService) -> BudgetService:
    if not inspect.iscoroutinefunction(getattr(service, "reserve", None)):
        raise ConfigurationError(
            "an AsyncClient shares a BudgetService, whose methods are coroutine functions "
            "(async def); a service whose methods block goes with a Client"
        )
    return service


def store_budget(settings: Settings) -> BudgetService:
    """The budget shared through ``settings.rate_limit.store`` (DESIGN 16)."""
    from ._rate_store import AsyncStoreBudget

    return AsyncStoreBudget(settings)


async def close_budget(budget: object) -> None:
    """Closes a store's connections if the client made them (never a service of the caller's)."""
    from ._rate_store import AsyncStoreBudget

    service = getattr(budget, "service", None)
    if isinstance(service, AsyncStoreBudget):
        await service.close()


async def give_back(budget: object) -> None:
    """Releases the slots of a shared budget that requests cut short left (``abandoned``):
    shielded, since a cancel brought them here, and bounded, since the holder may be away (its
    lease or TTL frees what is not released)."""
    abandoned = getattr(budget, "abandoned", None)
    if not abandoned:
        return
    service: BudgetService = budget.service  # type: ignore[attr-defined]
    with anyio.move_on_after(GIVE_BACK_TIMEOUT, shield=True):
        while abandoned:
            try:
                await service.release(abandoned.popleft())
            except Exception as exc:  # noted only: the holder frees it in time
                log.debug("a shared budget's slot was not given back: %s", type(exc).__name__)
