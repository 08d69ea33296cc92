"""What ``Client`` does its I/O with: the blocking twins of ``_io_async``, name for name (the
generated ``_client.py`` imports this module where ``_async_client.py`` imports that one).
Threads instead of tasks; time bounded by ``_deadline`` instead of a cancel scope."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from . import _deadline
from ._core.budget import SyncBudgetService
from ._core.config import Settings
from ._core.exceptions import ConfigurationError, RequestValidationError
from ._core.models import Submission, Task
from ._files import StorageError

if TYPE_CHECKING:
    from ._journal.journal import Journal, Scope
    from ._transport import Connection

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("imggw_client")

OnUpdate = Callable[[Task], Any]
OnSubmit = Callable[[Submission], Any]
Arm = Callable[[Callable[[], object]], float]  # a budget's wait: see ``wire.Sleep``


def sleep(seconds: float, arm: Arm | None = None) -> None:
    """Sleeps ``seconds``; or, given ``arm``, what it returns or until the wake it arms comes."""
    if arm is None:
        time.sleep(seconds)
        return
    woken = threading.Event()
    seconds = arm(woken.set)
    if seconds > 0:
        woken.wait(seconds)
    else:  # news came already: asked again, after the other threads had a turn
        time.sleep(0)


# A blocking read cannot be cancelled: the HTTP client a Client makes bounds every network
# operation by the time left to its request.
new_http = _deadline.bounded_client
bounded = _deadline.bounded


def check_deadline(deadline: float) -> None:
    """Between chunks of a body: one that keeps trickling in must still end by the deadline
    (a caller's own ``httpx.Client`` has no bounded network layer)."""
    if time.monotonic() > deadline:
        raise httpx.ReadTimeout("the request's deadline passed")


_AWAITED = "returns an awaitable, which a Client cannot await (an AsyncClient awaits it)"


def check_callback(callback: object, field: str) -> None:
    """An ``on_update`` or ``on_submit``: a plain function, refused before a request is sent if
    it is anything else (an ``async def`` one would never run)."""
    if not callable(callback):
        raise RequestValidationError(field, f"must be callable, not {type(callback).__name__}")
    # An async def function, or an object whose class's __call__ is one.
    if inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(
        type(callback).__call__
    ):
        raise RequestValidationError(field, f"is an async def function: it {_AWAITED}")


def notify(callback: Callable[[Any], Any], value: object) -> None:
    result = callback(value)
    if inspect.isawaitable(result):  # made by a plain function: refused, never left unawaited
        if inspect.iscoroutine(result):
            result.close()
        raise RequestValidationError("callback", _AWAITED)


def run_sync(func: Callable[..., T], *args: Any) -> T:
    return func(*args)


# A journal a Client opens from a path is opened at once: a path that cannot be used is an
# error of the constructor.
DEFER_JOURNAL = False


def record(journal: Journal | None, event: object, scope: Scope) -> None:
    """Commits a journal event before the flow goes on, in the calling thread (which may
    wait for another writer: nothing else runs on it). A write that fails after the submit's
    request left is the journal's to report: the call's answer stands."""
    if journal is None:
        return
    try:
        journal.record(event, scope)
    except (StorageError, ConfigurationError) as err:
        if not journal.unrecorded(event, err):
            raise


def map_concurrently(func: Callable[[T], R], items: Sequence[T], limit: int) -> list[R]:
    """``func`` of every item, at most ``limit`` at once (threads); results in the items' order."""
    if len(items) <= 1 or limit <= 1:  # no thread to start for one (as_completed's usual step)
        return [func(item) for item in items]
    pool = ThreadPoolExecutor(max_workers=max(1, min(limit, len(items))))
    interrupted = False
    try:
        return list(pool.map(func, items))
    except KeyboardInterrupt:  # Ctrl-C reaches the caller now; calls in flight end on their own
        interrupted = True
        raise
    finally:
        # Otherwise every call ends first, as a task group's do.
        pool.shutdown(wait=not interrupted, cancel_futures=interrupted)


def claim(conn: Connection[httpx.Client]) -> httpx.Client:
    """The HTTP client (a thread has no event loop: the one the client made, unless forked)."""
    return conn.claim(None)[0]


def close_http(conn: Connection[httpx.Client]) -> None:
    """Closes the HTTP client the client made (a thread's close reaches every thread's)."""
    conn.shut = True
    conn.http.close()


def checked_service(service: SyncBudgetService) -> SyncBudgetService:
    if inspect.iscoroutinefunction(getattr(service, "reserve", None)):
        raise ConfigurationError(
            "a Client shares a SyncBudgetService, whose methods block; a service whose "
            "methods are coroutine functions (async def) goes with an AsyncClient"
        )
    return service


def store_budget(settings: Settings) -> SyncBudgetService:
    """The budget shared through ``settings.rate_limit.store`` (DESIGN 16)."""
    from ._rate_store import StoreBudget

    return StoreBudget(settings)


def close_budget(budget: object) -> None:
    """Closes a store's connections if the client made them (never a service of the caller's)."""
    from ._rate_store import StoreBudget

    service = getattr(budget, "service", None)
    if isinstance(service, StoreBudget):
        service.close()


def give_back(budget: object) -> None:
    """Releases the slots of a shared budget that requests cut short left (``abandoned``)."""
    abandoned = getattr(budget, "abandoned", None)
    service: SyncBudgetService | None = getattr(budget, "service", None)
    while abandoned and service is not None:
        try:
            service.release(abandoned.popleft())
        except Exception as exc:  # noted only: the holder frees it in time
            log.debug("a shared budget's slot was not given back: %s", type(exc).__name__)
