"""The tracker's one run loop: many tasks through one client, bounded, resumable, with memory
that does not grow with the number of items. A batch (a single run, a shard, a shard on a Dask
worker, ``download --from``) and ``Tracker.collect`` all run here; they differ only in their
store and hooks (``_store``).

Items stream from the store in order into a bounded window of items in flight: an item with no
task id is submitted with its key (recorded before the request leaves: after a crash the
gateway replays the task) unless it first left longer ago than the gateway remembers keys
(``idempotency_window``: reported, never resent blindly), known task ids are waited on (never
resubmitted; one the gateway no longer knows ends ``not_found``), and finished tasks queue for
download slots, the soonest-expiring first (:class:`DownloadQueue`, with the pace of recent
downloads that tells which results are at risk of expiring in the queue), a dead link
refreshed before a result is declared expired. Every move is the store's to keep; the hooks
may refuse a submit (guards, room).

An item is waited on for at most the course's ``line_timeout``, with the polls the client
learned, under its request budget. Result links are kept as a store keeps them
(:func:`kept_links`: one that carries the API key is kept blanked, and its download asks the
gateway for it again); the partial files a killed collect left are swept
(:func:`sweep_partial_files`).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import os
import re
import stat
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Generic

import anyio
import anyio.abc
import anyio.to_thread
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from .. import _io_async, _telemetry
from .._async_client import AsyncClient
from .._core import states
from .._core.config import check_surface, key_forgotten
from .._core.exceptions import (
    DownloadError,
    ImggwError,
    InsufficientCreditsError,
    NotFoundError,
    ResultExpiredError,
    TaskFailedError,
    WaitTimeoutError,
)
from .._core.models import Submission, Task, TaskStatus
from .._core.states import State, Work
from .._core.text import REDACTED, printable
from .._download import WRITE_FAILED
from .._files import StorageError
from ._store import FATAL, NOT_FOUND, Course, Hooks, ItemT, Store, retry_later

__all__ = ["Loop", "waited"]

log = logging.getLogger("imggw_client")

NOT_FOUND_TRIES = 4  # queries of a just-submitted task the gateway says it does not know
MIN_IN_FLIGHT = 1024  # items in flight (submitted, waiting, queued for download) at most ...
IN_FLIGHT_PER_SLOT = 64  # ... or this many per unit of concurrency, whichever is more


# A download's partial file while it is written, as a collect names its results
# (`{task id}-{index}`, after `{surface}-` for the other surface's, then the download's hidden
# temporary name).
_PARTIAL = re.compile(r"\.(?:(?:alpha|beta)-)?[1-9][0-9]*-[0-9]+\.[0-9a-f]{8}\.part")
PARTIAL_AFTER = 600.0  # seconds unwritten after which a partial file is no live download's


def kept_links(client: AsyncClient, urls: Iterable[str]) -> list[str]:
    """Result links as a store keeps them: one that carries the API key (a gateway may sign
    links so) is kept blanked, for no file a store writes holds the key; its download asks the
    gateway for the link again.
    """
    return [client.redact_url(url) for url in urls]


@dataclass(order=True)
class _Queued:
    """A finished task waiting for a download slot: soonest expiry first, then (unknown
    expiry) in the order they finished."""

    expires: float
    seq: int
    item: Any = field(compare=False)
    done: anyio.Event = field(compare=False)
    context: object = field(compare=False, default=None)  # the line's span, for its download


class DownloadQueue:
    """Finished tasks waiting for a download slot, the soonest-expiring first, and the pace
    of recent downloads (what tells which results are at risk of expiring in the queue).
    """

    def __init__(self) -> None:
        self._heap: list[_Queued] = []
        self._ready = anyio.Semaphore(0)
        self._order = itertools.count()
        self.downloaded: deque[float] = deque(maxlen=64)  # when recent downloads ended

    def __len__(self) -> int:
        return len(self._heap)

    async def put(self, item: Any) -> None:
        """Queues the item (anything with an ``expires_at``: Unix seconds or None) for a
        download slot and waits for its turn to end."""
        queued = _Queued(
            item.expires_at or math.inf,
            next(self._order),
            item,
            anyio.Event(),
            _telemetry.current(),
        )
        heapq.heappush(self._heap, queued)
        self._ready.release()
        await queued.done.wait()

    async def serve(self, save: Callable[[Any], Awaitable[None]]) -> None:
        """One download slot: always the queued result whose links die first."""
        while True:
            await self._ready.acquire()
            item = heapq.heappop(self._heap)
            try:
                with _telemetry.resumed(item.context):
                    await save(item.item)
            finally:
                item.done.set()

    def expiries(self) -> list[float]:
        """The known link expiries of the queued results (Unix seconds), soonest first."""
        return sorted(q.expires for q in self._heap if math.isfinite(q.expires))

    def at_risk(self, expiries: list[float]) -> int:
        """Queued results whose links die before their turn at the recent download pace."""
        if not expiries or len(self.downloaded) < 2:
            return 0
        span = self.downloaded[-1] - self.downloaded[0]
        pace = (len(self.downloaded) - 1) / span if span > 0 else math.inf
        now = time.time()
        return sum(1 for turn, expires in enumerate(expiries) if now + turn / pace > expires)


def sweep_partial_files(folder: Path, quiet_for: float = PARTIAL_AFTER) -> int:
    """Removes the partial files of downloads a killed collect left in ``folder`` (those of a
    collect's naming, see :data:`_PARTIAL`, unwritten for ``quiet_for`` seconds: a live
    download, bounded by its timeout, writes sooner). Returns how many went. Blocking.
    """
    gone = 0
    try:
        names = os.listdir(folder)
    except OSError:  # no folder yet (made by the first download), or not ours to read
        return 0
    before = time.time() - quiet_for
    for name in names:
        if not _PARTIAL.fullmatch(name):
            continue
        path = folder / name
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours: left alone
            found = os.lstat(path)
            if stat.S_ISREG(found.st_mode) and found.st_mtime < before:
                path.unlink()
                gone += 1
    return gone


class _NotSent(Exception):
    """A submit that waited for its slot while the run stopped submitting: it is not sent."""


class Loop(Generic[ItemT]):
    """One run over a store's items (see the module's docstring): ``concurrency`` submits and
    downloads at once; ``wait`` False asks each running task once instead of waiting on it;
    ``guarded``: the hooks' admissions are taken one slot at a time (guards that must see
    the failures and charges of the submits ahead).
    """

    def __init__(
        self,
        client: AsyncClient,
        store: Store[ItemT],
        hooks: Hooks[ItemT],
        course: Course,
        *,
        concurrency: int,
        wait: bool = True,
        guarded: bool = False,
    ) -> None:
        self.client = client
        self.store = store
        self.hooks = hooks
        self.course = course
        self.concurrency = concurrency
        self.waits = wait
        self.queue = DownloadQueue()
        self.submits = anyio.CapacityLimiter(concurrency)
        # With guards, at most `concurrency` items are between their guards' yes and their
        # submit's answer; without, nothing waits for one.
        self.admitting = anyio.CapacityLimiter(concurrency) if guarded else None
        window = max(MIN_IN_FLIGHT, concurrency * IN_FLIGHT_PER_SLOT)
        self.in_flight = anyio.Semaphore(window)
        self.active = 0
        self.idle = anyio.Event()

    async def run(self, *beside: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Every item of the store brought as far as it goes in this run (or until the
        course's end), with the download slots and ``beside`` (a progress tick) going on."""
        with self.course.cancel:
            async with anyio.create_task_group() as group:
                for _ in range(self.concurrency):
                    group.start_soon(self.slot)
                for task in beside:
                    group.start_soon(task)
                await self.feed(group)
                await self.all_done()
                group.cancel_scope.cancel()

    # ------------------------------------------------------------------------ items

    async def feed(self, group: anyio.abc.TaskGroup) -> None:
        """Streams unfinished items from the store into the window of items in flight."""
        after = 0
        while self.course.fatal is None:
            chunk: Sequence[ItemT] = await anyio.to_thread.run_sync(self.store.chunk, after)
            if not chunk:
                return
            after = chunk[-1].line
            for item in chunk:
                work = self.store.work(item)
                if work is None or (self.course.stopped and work is Work.RESEND):
                    continue  # a guard stopped new submits: unsent items wait for a rerun
                await self.in_flight.acquire()
                self.active += 1
                group.start_soon(self.one, item)

    async def one(self, item: ItemT) -> None:
        """One item through its steps: submit, wait, download."""
        store = self.store
        try:
            with contextlib.ExitStack() as working, _telemetry.line_span(item.line):
                if store.work(item) is Work.RESEND:
                    await self.submit(item)
                if store.work(item) is not Work.RESEND:
                    working.enter_context(self.hooks.working(item))
                if store.work(item) is Work.WAIT:
                    await self.wait(item)
                if store.work(item) is Work.DOWNLOAD:
                    await self.download(item)
        except FATAL as err:
            self.course.stop(err)
        except Exception as exc:  # one item's fault must not end the run
            store.unexpected_fault(item, exc)
        finally:
            self.in_flight.release()
            self.active -= 1
            if self.active == 0:
                self.idle.set()

    async def all_done(self) -> None:
        """Waits until every item fed in has finished this run's work on it."""
        if self.active:
            self.idle = anyio.Event()
            await self.idle.wait()

    async def submit(self, item: ItemT) -> None:
        if self.forgotten(item):
            return
        # Items queued for a submit slot must not all pass the guards at once, before the
        # failures and charges of those ahead are known.
        async with self.admitting or contextlib.nullcontext():
            if self.course.stopped:
                return  # no more submits: the item waits for a rerun, with its key
            async with self.hooks.admit(item) as admitted:
                if admitted:
                    await self.send(item)

    def forgotten(self, item: ItemT) -> bool:
        """Whether the item's submit, of unknown outcome, first left longer ago than the
        gateway remembers keys: sent again, it could make (and bill) a second task. It is
        reported (one WARNING naming its key, the course's ``stale_keys``) and left as it is,
        for the caller to send explicitly if they choose."""
        first = getattr(item, "first_sent", None)
        window = self.client.idempotency_window
        # An item with no first send recorded has never left: nothing to hold back.
        if first is None or item.idempotency_key is None:
            return False
        if not key_forgotten(datetime.fromtimestamp(first, tz=timezone.utc), window, time.time()):
            return False
        key = item.idempotency_key
        self.course.stale_keys.append(key)
        log.warning(
            "a submit of unknown outcome (idempotency key %s, surface %s) was first sent longer "
            "ago than the gateway remembers keys (idempotency_window=%gs): it was not sent "
            "again, which could bill a second task; it is kept with its key. Send it yourself "
            "if no task was made for it",
            printable(key, 80),
            printable(item.surface, 20),
            window,
        )
        return True

    async def send(self, item: ItemT) -> None:
        fields, course = item.fields, self.course
        try:
            async for attempt in course.retrying(course.line_deadline()):
                with attempt:
                    async with self.submits:
                        if course.stopped:  # the run stopped while this item waited its turn
                            raise _NotSent
                        self.store.sending(item)
                        try:
                            sub = await self.client.submit(
                                fields["prompt"],
                                aspect_ratio=fields["aspect_ratio"],
                                resolution=fields["resolution"],
                                surface=check_surface(item.surface),
                                idempotency_key=item.idempotency_key,
                                validate=getattr(item, "validate", True),
                            )
                        except InsufficientCreditsError:
                            course.stopped = True  # before its slot is free: none goes after it
                            raise
        except _NotSent:  # nothing sent: what stopped the run is told by what stopped it
            await self.hooks.unsent(item, None)
            return
        except InsufficientCreditsError as err:  # nothing was made: it waits for a top-up
            await self.hooks.unsent(item, err)
            return
        except FATAL:
            raise
        except ImggwError as err:
            if not retry_later(err):  # refused: nothing made, nothing charged
                await self.hooks.unsent(item, err)
                self.store.fail(item, err.code or "refused", err.message)
            return  # out of time: the item stays unsent; its key resumes it
        item.task_id = sub.task_id
        # A replayed task started earlier, when is not known: it teaches no duration.
        item.submitted_at = sub.submitted_at.timestamp() if sub.submitted_at else None
        self.store.reached(item, State.RUNNING)

    async def wait(self, item: ItemT) -> None:
        course, store = self.course, self.store
        if course.remaining() <= 0:
            return
        until = course.line_deadline()
        try:
            task = await self.query(item, until)
        except WaitTimeoutError:  # still running: a later run resumes the wait
            if until < course.deadline:
                limit = course.line_timeout or 0.0
                store.left_for_next_run(item, f"its task still runs after {limit:g} s")
            return
        except TaskFailedError as err:
            task = err.task
        except FATAL:
            raise
        except NotFoundError as err:  # asked enough: the gateway no longer knows the task
            assert item.task_id is not None
            await self.record(states.NotFound(item.task_id, item.surface))
            store.fail(item, NOT_FOUND, err.message)
            return
        except ImggwError as err:
            # A query refused (a 402 once the balance is spent, a proxy's 400) or failing (5xx,
            # the network) says nothing of the task: the paid item is asked about again.
            store.left_for_next_run(item, f"its status query failed ({course.why(err)})")
            return
        if not task.is_terminal:
            await self.hooks.charged(item, task, final=False)
            return  # unfinished, and not waited on (a collect without --wait)
        await self.hooks.charged(item, task, final=True)
        await self.hooks.ended(item, task)
        if task.status is TaskStatus.FAILED:
            error = task.error
            store.fail(item, error.code if error else "failed", error.message if error else "")
            return
        item.urls = kept_links(self.client, task.image_urls)
        item.expires_at = task.expires_at.timestamp() if task.expires_at else None
        store.reached(item, State.SUCCEEDED)

    async def query(self, item: ItemT, until: float) -> Task:
        """The task of a submitted item: waited on until it ends (or ``until``: the line
        timeout or the run's deadline), or asked once (without waiting). A task the gateway
        has just made may not be visible everywhere behind it yet: a NotFound for an item this
        store made is asked again a few times, at the client's backoff, before it counts."""
        assert item.task_id is not None
        task_id, surface = item.task_id, check_surface(item.surface)
        policy = self.client.retry
        tries = NOT_FOUND_TRIES if item.made_here else 1
        out_of_time = self.course.out_of_time(until)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(NotFoundError),
            wait=wait_random_exponential(multiplier=policy.initial_backoff, max=policy.max_backoff),
            stop=lambda state: state.attempt_number >= tries or out_of_time(state),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                if not self.waits:
                    return await self.client.get(task_id, surface=surface)
                remaining = max(0.0, until - time.monotonic())

                async def seen(task: Task) -> None:  # a charge is kept as soon as it shows
                    if not task.is_terminal:
                        await self.hooks.charged(item, task, final=False)

                return await self.client.wait(
                    waited(item), surface=surface, wait_timeout=remaining, on_update=seen
                )
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    async def record(self, event: object) -> None:
        """Tells the client's journal (if any) what the loop concluded of a task."""
        client = self.client
        if client.journal is not None:
            await _io_async.record(client.journal, event, client.journal_scope)

    # ------------------------------------------------------------------------ downloads

    async def download(self, item: ItemT) -> None:
        """Queues the item for a download slot (soonest expiry first) and waits for its turn."""
        if not item.urls:
            self.store.fail(item, "no_result", f"task {item.task_id} succeeded without result URLs")
            return
        await self.queue.put(item)

    async def slot(self) -> None:
        """One download slot; a fault of one item's download ends only that item's step."""
        await self.queue.serve(self._save)

    async def _save(self, item: ItemT) -> None:
        try:
            await self.save_results(item)
        except FATAL as err:
            self.course.stop(err)
        except Exception as exc:  # one item's fault must not end the run
            self.store.unexpected_fault(item, exc)

    async def save_results(self, item: ItemT) -> None:
        """Saves the item's results where its store lands them, verified, and has the store
        keep them; the item is then saved, expired or failed, or stays where it stands for a
        later try (out of time, a query for fresh links that failed)."""
        assert item.task_id is not None
        course, store = self.course, self.store
        expires = (
            datetime.fromtimestamp(item.expires_at, tz=timezone.utc) if item.expires_at else None
        )
        task = Task(
            id=item.task_id,
            surface=check_surface(item.surface),
            status=TaskStatus.SUCCEEDED,
            image_urls=item.urls,
            expires_at=expires,
        )
        try:
            async for attempt in course.retrying(course.line_deadline()):
                with attempt:
                    if any(REDACTED in url for url in task.image_urls):
                        # A link kept blanked (it carried the key): the gateway hands it out
                        # again on a query.
                        task = await self.client.get(task.id, surface=task.surface)
                    files = await self.client.download(
                        task, store.landing(item), overwrite=True, prefix=store.prefix(item)
                    )
        except ResultExpiredError as err:  # the fresh links failed too: really gone
            store.expire(item, err.message)
            return
        except DownloadError as err:
            if err.code == WRITE_FAILED:  # the disk, not the link: the run stops here
                raise StorageError(
                    f"{err.message}; fix that, then run the same command to resume",
                    code="storage_failed",
                ) from err
            if not retry_later(err):
                store.fail(item, err.code or "download_failed", err.message)
            return
        except FATAL:
            raise
        except NotFoundError as err:  # its links dead, and the gateway does not know the task
            await self.record(states.Expired(item.task_id, item.surface))  # its results gone
            store.fail(item, NOT_FOUND, err.message)
            return
        except ImggwError as err:
            # The query for fresh links was refused or failed: it says nothing of the result,
            # which a later run fetches.
            if not retry_later(err):
                store.left_for_next_run(item, f"its download failed ({course.why(err)})")
            return  # out of time: a later run downloads it
        await store.keep(item, files)
        self.queue.downloaded.append(time.monotonic())
        item.urls = kept_links(self.client, [f.url for f in files])
        store.reached(item, State.SAVED)
        await self.hooks.saved(item)


def waited(item: ItemT) -> Submission | str:
    """What an item's wait is given: the submission its store made (its kind and start,
    whatever run sent it, so the wait polls by what the client learned), or the id of a task
    made elsewhere.
    """
    assert item.task_id is not None
    if not item.made_here or item.idempotency_key is None:
        return item.task_id
    started = item.submitted_at
    return Submission(
        task_id=item.task_id,
        idempotency_key=item.idempotency_key,
        surface=check_surface(item.surface),
        resolution=item.fields.get("resolution"),
        replayed=started is None,
        submitted_at=None if started is None else datetime.fromtimestamp(started, timezone.utc),
    )
