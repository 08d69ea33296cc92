"""The batch engine: every line of a planned run through submit -> wait -> download, bounded,
resumable, with memory that does not grow with the number of lines. A single run, a shard
and a shard on a Dask worker all run here; they differ only in their :class:`Workspace`.

Rows stream from the ledger in line order into a bounded window of lines in flight: a line
with no task id is submitted with its key (after a crash the gateway replays the task), known
task ids are waited on (never resubmitted: a key older than the gateway's memory must not be
resent blindly), and finished tasks queue for download slots, the soonest-expiring first. A
dead link is queried again for a fresh one before a result is declared expired. Every state
change goes through :meth:`Engine.move`, which holds it to ``_states.MOVES``.

What was paid for is never lost to this run's own limits: a line with a task id fails only when
its task failed (or its result expired, or the gateway says it does not know the task); any
other error leaves it where it stands for the next run. A line is waited on for at most
``line_timeout``. No submit goes out without room on the disk for the results of every line in
flight and its own (``rules.RESULT_ROOM``), nor after the gateway refused one for want of credits.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import itertools
import logging
import math
import shutil
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.to_thread
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_exception_type,
    wait_random_exponential,
)

from .. import _telemetry
from .._async_client import AsyncClient
from .._config import check_surface
from .._core import reasons
from .._core.durations import WINDOW
from .._core.flows import NOT_AN_IMAGE
from .._core.retry import classify
from .._core.rules import RESOLUTIONS, RESULT_ROOM
from .._core.surfaces import REDACTED, redact_url, safe_message
from .._download import WRITE_FAILED
from .._exceptions import (
    AuthenticationError,
    ConfigurationError,
    DownloadError,
    ImggwError,
    InsufficientCreditsError,
    NotFoundError,
    PermissionDeniedError,
    ResultExpiredError,
    TaskFailedError,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from .._files import StorageError, refuse_link
from .._models import DownloadedFile, Submission, Task, TaskStatus
from ._gallery import write_gallery
from ._guards import Caps, Charge, Guard, LocalGuard, Spending, reported, settles
from ._input import COLLECT
from ._ledger import NOT_FOUND, STOPPED_BY, Ledger, Row, Totals, storage_error
from ._manifest import manifest_rows, write_manifest
from ._options import BatchOptions
from ._plan import WHOLE, IdentityStore, Plan, Slice, plan_run
from ._reports import BatchProgress, BatchReport
from ._states import DOWNLOADING, EXPIRED, FAILED, FINAL, MOVES, PENDING, RUNNING, SAVED, LineState

__all__ = [
    "NO_ROOM",
    "LocalStore",
    "ResultStore",
    "Workspace",
    "execute",
    "file_sha256",
    "free_bytes",
]

log = logging.getLogger("imggw_client")
NOT_FOUND_TRIES = 4  # queries of a just-submitted task the gateway says it does not know
UNEXPECTED_LOGGED = 20  # faults no rule covers, logged one by one; the rest are counted
# Failures that doom every line alike: the run stops, and its unfinished lines wait for a rerun
# (a submit answered 404, a base URL with a wrong path, is a ConfigurationError: nothing was
# made, nothing billed, and the same command with the right URL resumes every line).
FATAL = (AuthenticationError, PermissionDeniedError, ConfigurationError, StorageError)
RETRY_PAUSE = (0.5, 10.0)  # first and longest pause before a line's step is tried again
MIN_IN_FLIGHT = 1024  # lines in flight (submitted, waiting, queued for download) at most ...
IN_FLIGHT_PER_SLOT = 64  # ... or this many per unit of concurrency, whichever is more
PROGRESS_EVERY = 0.25  # seconds between progress snapshots
GALLERY_EVERY = 30.0  # seconds between gallery rewrites during a run (and at least 20x its cost)
# Downloads that another try in this run would not mend (a rerun looks at a document's link
# again: what a proxy served today may be the image tomorrow).
_FINAL_DOWNLOAD_CODES = frozenset({"result_too_large", WRITE_FAILED, NOT_AN_IMAGE})
RESULT_EXPIRED = reasons.RESULT_EXPIRED.code
NO_ROOM = "no_room"  # StorageError.code: the folder has no room for the next line's result
LEFT_LOGGED = 20  # lines left for the next run (a query error, the line timeout) logged one by one


class _NotSent(Exception):
    """A submit that waited for its slot while the run stopped submitting: it is not sent."""


def free_bytes(folder: Path) -> int | None:
    """The bytes free to this user on ``folder``'s filesystem; None when it cannot tell (then
    the download still checks every write). The engine asks it before each submit, by this
    name, so that a test may put a fake disk in its place.

    Example::

        free_bytes(Path("out"))   # 52613349376
    """
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _room(row: Row) -> int:
    return _room_of(str(row.fields.get("resolution") or ""))


def _room_of(resolution: str) -> int:
    """The room a result of ``resolution`` may need (``rules.RESULT_ROOM``; a collected task,
    whose resolution is not known, 1k's: a result that does not fit costs it nothing)."""
    return RESULT_ROOM.get(resolution.lower() or "1k", max(RESULT_ROOM.values()))


class ResultStore(Protocol):
    """Where a run's results and manifest belong: the run's own folder (nothing to do), or a
    shard's output folder, shared by every shard and maybe on an object store."""

    async def keep(self, files: list[DownloadedFile]) -> None:
        """Puts files just saved and verified in the run's folder in their place."""

    def is_whole(self, name: str, size: int, sha256: str, *, hashes: bool) -> bool:
        """Whether a result kept earlier is there and whole (blocking)."""

    def finish(self, manifest: Path) -> None:
        """The run ends: its ledger is flushed and its manifest written (blocking)."""


def file_sha256(path: Path) -> str | None:
    """The file's sha256, or None if it cannot be read."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


class LocalStore:
    """Results left where the run saves them: its own folder (a single run)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def keep(self, files: list[DownloadedFile]) -> None:
        pass

    def is_whole(self, name: str, size: int, sha256: str, *, hashes: bool) -> bool:
        path = self.folder / name
        # A link planted where a saved image was would otherwise count as the image (a paid
        # result never saved again): refused, naming it, as anywhere in the folder.
        refuse_link(path)
        try:
            whole = path.stat().st_size == size
        except OSError:
            whole = False
        return whole and (not hashes or file_sha256(path) == sha256)

    def finish(self, manifest: Path) -> None:
        pass


@dataclass
class Workspace:
    """Where a run works: ``folder`` (on this machine) holds its ledger and receives its
    results; ``store`` puts them where they belong; ``identity`` keeps the run's identity;
    ``part`` is the part of the input it reads; ``gallery`` the title of the gallery it writes
    as it goes (None: none)."""

    folder: Path
    ledger: Ledger
    identity: IdentityStore
    store: ResultStore
    part: Slice = WHOLE
    gallery: str | None = None


def _retry_later(err: BaseException) -> bool:
    """A failure after which a line is tried again later instead of failing: what the core
    retries, and an unknown submit outcome (the line's key makes another try safe)."""
    if not isinstance(err, ImggwError) or isinstance(err, FATAL):
        return False
    if isinstance(err, DownloadError) and err.code in _FINAL_DOWNLOAD_CODES:
        return False
    return isinstance(err, (UnknownOutcomeError, DownloadError)) or classify(err).retry


def _unknown_cost(credits: float | None, cost: float | None) -> int:
    """1 for a line charged in credits with no cost stated (as ``Totals.cost_unknown``)."""
    return int(credits is not None and cost is None)


@dataclass(order=True)
class _Queued:
    """A finished task waiting for a download slot: soonest expiry first, then (unknown
    expiry) in the order they finished."""

    expires: float
    seq: int
    row: Row = field(compare=False)
    done: anyio.Event = field(compare=False)
    context: object = field(compare=False, default=None)  # the line's span, for its download


class Engine:
    """One run over a planned ledger: the lines in flight, their moves, money and progress."""

    def __init__(
        self,
        client: AsyncClient,
        work: Workspace,
        totals: Totals,
        *,
        options: BatchOptions,
        surface: str,
        deadline: float,
        on_progress: Callable[[BatchProgress], None] | None,
        guard: Guard,
    ) -> None:
        self.client = client
        self.guard = guard
        self.stopped = False  # no more submits in this run (a guard, a 402, the disk) ...
        self.stop_noted = False
        self.stopped_by: str | None = None  # ... this guard, having seen this
        self.stop_reason = ""
        self.no_room: StorageError | None = None  # ... or the disk: the run ends with this
        self.to_store = 0  # bytes the results of lines running or downloading may need
        self.reserved = 0  # ... and of lines whose submit is on its way
        self.working = 0  # lines of this run between their submit and their end in this run
        self.room_lock = anyio.Lock()
        self.room_changed = anyio.Event()
        self.left = 0  # lines left for the next run by a query error or the line timeout
        self.work = work
        self.ledger = work.ledger
        self.options = options
        self.surface = surface
        self.counts = totals.counts
        self.credits, self.cost = totals.credits, totals.cost
        self.cost_unknown = totals.cost_unknown
        self.total = sum(self.counts.values())
        self.deadline = deadline
        self.on_progress = on_progress
        self.submits = anyio.CapacityLimiter(options.concurrency)
        # With guards, at most `concurrency` lines are between their guards' yes and their
        # submit's answer; without, nothing waits for one.
        guarded = options.caps != Caps()
        self.admitting = anyio.CapacityLimiter(options.concurrency) if guarded else None
        window = max(MIN_IN_FLIGHT, options.concurrency * IN_FLIGHT_PER_SLOT)
        self.in_flight = anyio.Semaphore(window)
        self.active = 0
        self.idle = anyio.Event()
        self.queue: list[_Queued] = []
        self.queued = anyio.Semaphore(0)
        self.order = itertools.count()
        self.fatal: ImggwError | None = None
        self.started = time.monotonic()
        self.finished_here = 0
        self.downloaded: deque[float] = deque(maxlen=64)  # when recent downloads ended
        self.last_progress = 0.0
        self.last_gallery = time.monotonic()
        self.gallery_cost = 0.0
        self.cancel = anyio.CancelScope()
        self.unexpected = 0

    # ------------------------------------------------------------------------ progress

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def progress(self) -> BatchProgress:
        limit = self.client.rate_limit
        pace = limit.submits_per_second
        shown = limit if pace or limit.queries_per_second else None
        pending = self.counts.get(PENDING, 0)
        expiries = sorted(q.expires for q in self.queue if math.isfinite(q.expires))
        soonest = None
        if expiries:
            soonest = datetime.fromtimestamp(expiries[0], tz=timezone.utc)
        return BatchProgress(
            total=self.total,
            counts={state: n for state, n in self.counts.items() if n},
            credits=self.credits,
            cost=round(self.cost, 6),
            elapsed=time.monotonic() - self.started,
            finished_this_run=self.finished_here,
            rate_limit=shown,
            least_time_left=pending / pace if pace else None,
            awaiting_download=len(self.queue),
            soonest_expiry=soonest,
            at_risk=self._at_risk(expiries),
            cost_unknown=self.cost_unknown,
            max_credits=self.options.max_credits,
            max_cost=self.options.max_cost,
            stopped_by=self.stopped_by,
            typical_durations=self.typical_durations(),
        )

    def typical_durations(self) -> dict[str, float]:
        """The median running time the client learned per resolution, on the run's surface."""
        model, now = self.client._flows.durations, time.monotonic()
        found = {res: model.quantile((self.surface, res), 0.5, now) for res in RESOLUTIONS}
        return {res: round(took, 3) for res, took in found.items() if took is not None}

    async def learn_from_ledger(self) -> None:
        """A resumed run's polls start from what its ledger knows of its tasks' durations
        (DESIGN 15), not from nothing."""
        found = await anyio.to_thread.run_sync(self.ledger.durations, WINDOW)
        model, now = self.client._flows.durations, time.monotonic()
        for (surface, resolution), took in found.items():
            kind = (surface, resolution.lower())  # as a wait names it
            model.seed(kind, took, now, grace=self.client.poll.initial_interval)

    def _at_risk(self, expiries: list[float]) -> int:
        """Queued results whose links die before their turn at the recent download pace."""
        if not expiries or len(self.downloaded) < 2:
            return 0
        span = self.downloaded[-1] - self.downloaded[0]
        pace = (len(self.downloaded) - 1) / span if span > 0 else math.inf
        now = time.time()
        return sum(1 for turn, expires in enumerate(expiries) if now + turn / pace > expires)

    def report_progress(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress is not None and (force or now - self.last_progress >= PROGRESS_EVERY):
            self.last_progress = now
            self.on_progress(self.progress())

    # ------------------------------------------------------------------------ moves

    def move(self, row: Row, state: LineState, *, at_once: bool = False) -> None:
        """Moves the row to ``state`` (one of the moves ``_states.MOVES`` allows), keeps the
        counts, and queues the row for the ledger (``at_once``: writes it now, in this thread,
        before a run begins)."""
        if state not in MOVES[row.state]:
            raise AssertionError(f"line {row.line}: no move from {row.state} to {state}")
        self.counts[row.state] -= 1
        self.counts[state] += 1
        unsaved = (RUNNING, DOWNLOADING)
        if (row.state in unsaved) != (state in unsaved):
            self.to_store += _room(row) if state in unsaved else -_room(row)
            self.room_changed.set()
        row.state = state
        now = time.time()
        if state is DOWNLOADING and row.completed_at is None:
            row.completed_at = now
        if state in FINAL:
            self.finished_here += 1
            row.finished_at = now
        if at_once:
            self.ledger.save_now(row)
            return
        self.ledger.save(row)
        self.report_progress()

    async def charge(self, row: Row, task: Task, *, final: bool) -> None:
        """What the line's task reports it cost, as soon as any answer states it: the run's
        money, the row, and the guard (a cap is kept by charges, not by guesses). While the
        task runs its charge never drops (``_guards.reported``)."""
        before = Charge(row.credits, row.cost).clamped()
        now = reported(before, Charge(task.credits, task.cost), final=final)
        if now != before and now.known:
            self.credits += (now.credits or 0) - (before.credits or 0)
            self.cost += (now.cost or 0) - (before.cost or 0)
            self.cost_unknown += _unknown_cost(now.credits, now.cost)
            self.cost_unknown -= _unknown_cost(before.credits, before.cost)
            row.credits, row.cost = now.credits, now.cost
            if not final:  # the line's state will not move yet: keep the charge now
                self.ledger.save(row)
        if row.kind != COLLECT and (now != before or final):
            resolution = str(row.fields.get("resolution", ""))
            failed = task.status is TaskStatus.FAILED
            await self.guard.charged(row.identity, resolution, before, now, final=final,
                                     failed=failed)  # fmt: skip

    def fail(self, row: Row, code: str, message: str) -> None:
        row.error_code, row.error_message = code, message
        self.move(row, FAILED)

    def stop(self, err: ImggwError) -> None:
        self.fatal = self.fatal or err
        self.cancel.cancel()

    def unexpected_fault(self, row: Row, exc: Exception) -> None:
        """A fault no rule covers (a bug here or beneath): one line's step, not the run. The
        line keeps the state last saved, so the next run takes it up again, with its key."""
        self.unexpected += 1
        if self.unexpected > UNEXPECTED_LOGGED:
            return
        frame = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" at {Path(frame[0].filename).name}:{frame[0].lineno}" if frame else ""
        # Only the type, place and a cleaned message: an exception's text may quote a header.
        log.error(
            "line %d: unexpected %s%s: %s; the line stays unfinished for the next run%s",
            row.line, type(exc).__name__, where,
            safe_message(self.client.redact(str(exc))) or "",
            "; later ones are counted, not logged" if self.unexpected == UNEXPECTED_LOGGED else "",
        )  # fmt: skip

    # ------------------------------------------------------------------------ retries

    def line_deadline(self) -> float:
        """When a line's step begun now gives up for this run: ``line_timeout`` from now, or
        the run's deadline if sooner."""
        limit = self.options.line_timeout
        return self.deadline if limit is None else min(self.deadline, time.monotonic() + limit)

    def out_of_time(self, until: float) -> Callable[[RetryCallState], bool]:
        """A tenacity stop: the run ends (a failure that ends it), or ``until`` comes, before
        the next try would go."""

        def stop(state: RetryCallState) -> bool:
            left = until - time.monotonic()
            return self.fatal is not None or (state.upcoming_sleep or 0) >= left

        return stop

    def retrying(self, until: float) -> AsyncRetrying:
        """A line's step tried again after failures worth waiting out, until ``until`` (or a
        failure that ends the run)."""
        return AsyncRetrying(
            retry=retry_if_exception(_retry_later),
            wait=wait_random_exponential(multiplier=RETRY_PAUSE[0], max=RETRY_PAUSE[1]),
            stop=self.out_of_time(until),
            reraise=True,
        )

    def left_for_next_run(self, row: Row, why: str) -> None:
        """The line keeps its state (and its key) for the next run, which takes it up again:
        said in the log, one by one for the first few."""
        self.left += 1
        if self.left <= LEFT_LOGGED:
            log.warning(
                "line %d (task %s): %s; it stays %s for the next run%s",
                row.line, row.task_id, why, row.state,
                "; later ones are counted, not logged" if self.left == LEFT_LOGGED else "",
            )  # fmt: skip

    # ------------------------------------------------------------------------ lines

    async def feed(self, group: anyio.abc.TaskGroup) -> None:
        """Streams unfinished rows from the ledger into the window of lines in flight."""
        after = 0
        while self.fatal is None:
            chunk = await anyio.to_thread.run_sync(self.ledger.next_rows, after)
            if not chunk:
                return
            after = chunk[-1].line
            for row in chunk:
                if row.state in FINAL or (self.stopped and row.state is PENDING):
                    continue  # a guard stopped new submits: pending lines wait for a rerun
                await self.in_flight.acquire()
                self.active += 1
                group.start_soon(self.line, row)

    async def line(self, row: Row) -> None:
        working = False
        try:
            with _telemetry.line_span(row.line):
                if row.state is PENDING:
                    await self.submit(row)
                if row.state is not PENDING:
                    working, self.working = True, self.working + 1
                if row.state is RUNNING:
                    await self.wait(row)
                if row.state is DOWNLOADING:
                    await self.download(row)
        except FATAL as err:
            self.stop(err)
        except Exception as exc:  # one line's fault must not end the run
            self.unexpected_fault(row, exc)
        finally:
            if working:
                self.working -= 1
                self.room_changed.set()  # a line waiting for room may stop waiting
            self.in_flight.release()
            self.active -= 1
            if self.active == 0:
                self.idle.set()

    async def all_done(self) -> None:
        """Waits until every line fed in has finished this run's work on it."""
        if self.active:
            self.idle = anyio.Event()
            await self.idle.wait()

    async def submit(self, row: Row) -> None:
        fields = row.fields
        resolution = str(fields.get("resolution", ""))
        # Lines queued for a submit slot must not all pass the guards at once, before the
        # failures and charges of those ahead are known.
        async with self.admitting or contextlib.nullcontext():
            if self.stopped:
                return  # no more submits: the line waits for a rerun, with its key
            room = _room(row)
            if not await self.room_for(row, room):
                return  # no room for its result: the line waits for a rerun, with its key
            try:
                if not await self.guard.admit(row.identity, resolution):
                    await self.note_stop()
                    return  # a guard stopped new submits: the line waits for a rerun
                await self.send(row)
            finally:
                self.reserved -= room  # a line sent counts in to_store now
                self.room_changed.set()

    async def room_for(self, row: Row, room: int) -> bool:
        """Waits until the folder has room for the results of every line in flight and this
        one's, and holds this one's (``reserved``); False, and the run stops submitting, when
        it lacks that room with nothing in flight that could give some back. One line asks at
        a time, in the order they came."""
        async with self.room_lock:
            while not self.stopped:
                self.room_changed = anyio.Event()
                free = free_bytes(self.work.folder)  # looked up now: a test's fake disk
                need = self.to_store + self.reserved + room
                if free is None or free >= need:
                    self.reserved += room
                    return True
                if not (self.working or self.reserved):  # nothing would give room back
                    self.stop_for_room(free, need)
                    self.report_progress(force=True)
                    break
                await self.room_changed.wait()
        return False

    def stop_for_room(self, free: int, need: int) -> None:
        self.stopped = True
        flying = self.counts.get(RUNNING, 0) + self.counts.get(DOWNLOADING, 0)
        mib = 1 << 20
        self.no_room = StorageError(
            f"{self.work.folder} has {free / mib:.1f} MiB free; the results of the next line"
            + (f" and of the {flying} unsaved ones" if flying else "")
            + f" may need about {math.ceil(need / mib)} MiB: nothing more was sent (what was "
            "paid for is saved); make room, then run the same command to resume",
            code=NO_ROOM,
        )

    async def send(self, row: Row) -> None:
        fields = row.fields
        try:
            async for attempt in self.retrying(self.line_deadline()):
                with attempt:
                    async with self.submits:
                        if self.stopped:  # the run stopped while this line waited its turn
                            raise _NotSent
                        try:
                            sub = await self.client.submit(
                                fields["prompt"],
                                aspect_ratio=fields["aspect_ratio"],
                                resolution=fields["resolution"],
                                surface=row.surface,
                                idempotency_key=row.idempotency_key,
                            )
                        except InsufficientCreditsError:
                            self.stopped = True  # before its slot is free: none goes after it
                            raise
        except _NotSent:  # nothing sent: what stopped the run is told by what stopped it
            await self.guard.release(row.identity)
            return
        except InsufficientCreditsError:  # nothing was made: the line waits for a top-up
            await self.guard.release(row.identity)
            await self.guard.out_of_credits()
            await self.note_stop()
            return
        except FATAL:
            raise
        except ImggwError as err:
            if not _retry_later(err):  # refused: nothing made, nothing charged
                await self.guard.release(row.identity)
                await self.guard.failed(err.code or "refused")
                self.fail(row, err.code or "refused", err.message)
            return  # out of time: the line stays pending; its key resumes it (still counted)
        row.task_id = sub.task_id
        # A replayed task started earlier, when is not known: it teaches no duration.
        row.submitted_at = sub.submitted_at.timestamp() if sub.submitted_at else None
        self.move(row, RUNNING)

    async def note_stop(self) -> None:
        """A guard refused a submit, or the gateway one for want of credits: no more are tried
        in this run, and the guard's word on why is kept for the report."""
        self.stopped = True
        if not self.stop_noted:
            self.stop_noted = True
            state = await self.guard.state()
            self.stopped_by, self.stop_reason = state.stopped_by, state.why
            self.report_progress(force=True)  # a display says so at once, not at the next line

    async def wait(self, row: Row) -> None:
        if self.remaining() <= 0:
            return
        until = self.line_deadline()
        try:
            task = await self.query(row, until)
        except WaitTimeoutError:  # still running: a later run resumes the wait
            if until < self.deadline:
                limit = self.options.line_timeout
                self.left_for_next_run(row, f"its task still runs after {limit:g} s")
            return
        except TaskFailedError as err:
            task = err.task
        except FATAL:
            raise
        except NotFoundError as err:  # its own line fails, no more; the next run looks again
            self.fail(row, NOT_FOUND, err.message)
            return
        except ImggwError as err:
            # A query refused (a 402 once the balance is spent, a proxy's 400) or failing (5xx,
            # the network) says nothing of the task: the paid line is asked about again.
            why = safe_message(self.client.redact(err.message)) or type(err).__name__
            self.left_for_next_run(row, f"its status query failed ({err.code or why})")
            return
        if not task.is_terminal:
            await self.charge(row, task, final=False)
            return  # unfinished, and not waited on (collect without --wait)
        await self.charge(row, task, final=True)
        if task.status is TaskStatus.FAILED:
            error = task.error
            code = error.code if error else "failed"
            if row.kind != COLLECT:
                await self.guard.failed(code)
            self.fail(row, code, error.message if error else "")
            return
        row.urls = self.kept_links(task.image_urls)
        row.expires_at = task.expires_at.timestamp() if task.expires_at else None
        self.move(row, DOWNLOADING)

    async def query(self, row: Row, until: float) -> Task:
        """The task of a submitted line: waited on until it ends (or ``until``: the line
        timeout or the run's deadline), or asked once (collect without waiting). A task the
        gateway has just made may not be visible everywhere behind it yet: a NotFound for a
        line submitted by a run is asked again a few times, at the client's backoff, before it
        counts."""
        assert row.task_id is not None
        policy = self.client.retry
        tries = NOT_FOUND_TRIES if row.kind != COLLECT else 1
        out_of_time = self.out_of_time(until)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(NotFoundError),
            wait=wait_random_exponential(multiplier=policy.initial_backoff, max=policy.max_backoff),
            stop=lambda state: state.attempt_number >= tries or out_of_time(state),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                if not self.options.wait:
                    return await self.client.get(row.task_id, surface=row.surface)
                remaining = max(0.0, until - time.monotonic())

                async def seen(task: Task) -> None:  # a charge is kept as soon as it shows
                    if not task.is_terminal:
                        await self.charge(row, task, final=False)

                return await self.client.wait(_waited(row), surface=row.surface,
                                              timeout=remaining, on_update=seen)  # fmt: skip
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    async def download(self, row: Row) -> None:
        """Queues the row for a download slot (soonest expiry first) and waits for its turn."""
        if not row.urls:
            self.fail(row, "no_result", f"task {row.task_id} succeeded without result URLs")
            return
        item = _Queued(row.expires_at or math.inf, next(self.order), row, anyio.Event(),
                       _telemetry.current())  # fmt: skip
        heapq.heappush(self.queue, item)
        self.queued.release()
        await item.done.wait()

    async def downloader(self) -> None:
        """One download slot: always the queued result whose links die first."""
        while True:
            await self.queued.acquire()
            item = heapq.heappop(self.queue)
            try:
                with _telemetry.resumed(item.context):
                    await self.save_results(item.row)
            except FATAL as err:
                self.stop(err)
            except Exception as exc:  # one line's fault must not end the run
                self.unexpected_fault(item.row, exc)
            finally:
                item.done.set()

    async def save_results(self, row: Row) -> None:
        assert row.task_id is not None
        expires = (
            datetime.fromtimestamp(row.expires_at, tz=timezone.utc) if row.expires_at else None
        )
        task = Task(
            id=row.task_id,
            surface=check_surface(row.surface),
            status=TaskStatus.SUCCEEDED,
            image_urls=row.urls,
            expires_at=expires,
        )
        try:
            async for attempt in self.retrying(self.line_deadline()):
                with attempt:
                    if any(REDACTED in url for url in task.image_urls):
                        # A link the ledger keeps blanked (it carried the key): the gateway
                        # hands it out again on a query.
                        task = await self.client.get(task.id, surface=task.surface)
                    files = await self.client.download(
                        task, self.work.folder, overwrite=True, prefix=self.file_prefix(row)
                    )
        except ResultExpiredError as err:  # the fresh links failed too: really gone
            message = err.message
            if row.files:  # saved by an earlier run: it did not expire before its download
                message = (
                    "the files saved earlier are gone from the folder, and the gateway no "
                    f"longer has the result ({message})"
                )
            row.error_code, row.error_message = RESULT_EXPIRED, message
            self.move(row, EXPIRED)
            return
        except DownloadError as err:
            if err.code == WRITE_FAILED:  # the disk, not the link: the run stops here
                raise StorageError(
                    f"{err.message}; fix that, then run the same command to resume",
                    code="storage_failed",
                ) from err
            if not _retry_later(err):
                self.fail(row, err.code or "download_failed", err.message)
            return
        except FATAL:
            raise
        except NotFoundError as err:  # its links dead, and the gateway does not know the task
            self.fail(row, NOT_FOUND, err.message)
            return
        except ImggwError as err:
            # The query for fresh links was refused or failed: it says nothing of the result,
            # which a later run fetches.
            if not _retry_later(err):
                why = safe_message(self.client.redact(err.message)) or type(err).__name__
                self.left_for_next_run(row, f"its download failed ({err.code or why})")
            return  # out of time: a later run downloads it
        await self.work.store.keep(files)
        self.downloaded.append(time.monotonic())
        row.urls = self.kept_links([f.url for f in files])
        row.files = [{"path": f.path.name, "sha256": f.sha256, "size": f.size} for f in files]
        self.move(row, SAVED)
        await self.maybe_gallery()

    def kept_links(self, urls: Iterable[str]) -> list[str]:
        """Result links as the ledger keeps them: one that carries the API key (a gateway may
        sign links so) is kept blanked, for no file in the folder holds the key; its download
        asks the gateway for the link again."""
        secrets = (self.client._settings.api_key,)
        return [redact_url(url, secrets) for url in urls]

    def file_prefix(self, row: Row) -> str:
        """Task ids are per surface: a task of the other surface may share an id with one of
        the run's, so its files' names start with its surface."""
        return "" if row.surface == self.surface else f"{row.surface}-"

    # ------------------------------------------------------------------------ files

    async def maybe_gallery(self) -> None:
        """The gallery, rewritten now and then as lines finish (never more than 5% of the
        time), so a long run can be looked at while it goes."""
        if self.work.gallery is None:
            return
        now = time.monotonic()
        if now - self.last_gallery < max(GALLERY_EVERY, 20 * self.gallery_cost):
            return
        self.last_gallery = now
        await anyio.to_thread.run_sync(self.write_gallery)
        self.gallery_cost = time.monotonic() - now

    def write_gallery(self) -> None:
        assert self.work.gallery is not None
        self.ledger.flush()
        try:
            rows = manifest_rows(self.ledger.iter_rows())
            write_gallery(self.work.folder, rows, title=self.work.gallery)
        except OSError as exc:
            raise storage_error(self.work.folder, exc) from exc

    def verify_files(self, *, hashes: bool) -> None:
        """Saved lines whose files are missing or damaged go back to be downloaded again: a
        size check by default, every file's sha256 with ``hashes``. Such a line keeps its list
        of files until it is saved again: that it was saved once tells a result gone at the
        gateway from one that expired before its download. Blocking; before the run."""
        for row in self.ledger.iter_rows(states=(SAVED,)):
            for f in row.files:
                if not self.work.store.is_whole(f["path"], f["size"], f["sha256"], hashes=hashes):
                    self.move(row, DOWNLOADING, at_once=True)
                    break

    def finish(self) -> Path:
        """Everything saved, the manifest and the gallery written: also after a crash of the
        run (an interrupted run's manifest shows where it stopped). Blocking."""
        try:
            self.ledger.flush()
        except StorageError as err:
            self.fatal = self.fatal or err
        # What stopped this run's submits, for `imggw batch status` (cleared by a run that was
        # not stopped: its line states say the rest).
        self.ledger.set_meta(STOPPED_BY, self.stopped_by)
        manifest = write_manifest(self.work.folder, manifest_rows(self.ledger.iter_rows()))
        if self.work.gallery is not None:
            self.write_gallery()
        self.work.store.finish(manifest)
        return manifest

    async def count_unsaved(self) -> None:
        """The room the results of lines sent by earlier runs, and not saved yet, may need."""
        found = await anyio.to_thread.run_sync(self.ledger.unsaved_by_resolution)
        self.to_store += sum(_room_of(resolution) * n for resolution, n in found.items())

    async def count_in_flight(self) -> None:
        """Lines sent by an earlier run whose price is not known yet (no charge stated, or 0
        while running) count in flight for the guard, as if this run had sent them (a cap
        holds across reruns)."""
        rows = await anyio.to_thread.run_sync(
            lambda: [r for r in self.ledger.iter_rows(states=(RUNNING,)) if r.kind != COLLECT]
        )
        for row in rows:
            if not settles(Charge(row.credits, row.cost).clamped(), final=False):
                await self.guard.flying(row.identity, str(row.fields.get("resolution", "")))


def _waited(row: Row) -> Submission | str:
    """What a line's wait is given: the submission it made (its kind and start, whatever run
    sent it, so the wait polls by what the client learned), or a collected task's id."""
    assert row.task_id is not None
    if row.kind == COLLECT or row.idempotency_key is None:
        return row.task_id
    started = row.submitted_at
    return Submission(
        task_id=row.task_id, idempotency_key=row.idempotency_key,
        surface=check_surface(row.surface),
        resolution=row.fields.get("resolution"), replayed=started is None,
        submitted_at=None if started is None else datetime.fromtimestamp(started, timezone.utc),
    )  # fmt: skip


def local_guard(ledger: Ledger, totals: Totals, options: BatchOptions) -> LocalGuard:
    """The guard of a run in one process: its caps, what the folder's run was charged so far
    and the highest charge seen per resolution (from its ledger). Blocking."""
    prices = {res: Charge(*charge) for res, charge in ledger.charges().items()}
    spent = Charge(totals.credits, totals.cost)
    return LocalGuard(Spending(options.caps, spent=spent, prices=prices))


def _sweep_partial_files(folder: Path) -> None:
    """Temp files of downloads cut short by a kill: we hold the folder's lock, so no live run
    owns them."""
    for leftover in folder.glob(".*.part"):
        leftover.unlink(missing_ok=True)


async def execute(
    source: str | Path | Iterable[Any],
    work: Workspace,
    *,
    client: AsyncClient,
    options: BatchOptions,
    on_progress: Callable[[BatchProgress], None] | None = None,
    guard: Guard | None = None,
) -> BatchReport:
    """Plans and runs a run in its workspace: the one engine of a single run, a shard and a
    shard on a Dask worker. A plan that may not go raises before anything is sent (and a
    ledger this process made for it is removed). ``guard`` keeps the run's caps (default:
    one in this process, from ``options`` and the folder's ledger; a Dask run's is held by its
    scheduler)."""
    started = time.monotonic()
    surface = check_surface(options.surface or client.surface)
    planning = functools.partial(plan_run, source, work.folder, work.ledger, work.identity,
                                 surface=surface, options=options, part=work.part)  # fmt: skip
    try:
        plan: Plan = await anyio.to_thread.run_sync(planning)
    except BaseException:
        work.ledger.discard()  # a refused plan leaves no ledger where there was none
        raise
    # Links kept in clear by versions before links were kept blanked: the key goes now.
    key = client._settings.api_key
    await anyio.to_thread.run_sync(work.ledger.blank_links, key, REDACTED)
    totals = work.ledger.totals()
    if guard is None:
        guard = await anyio.to_thread.run_sync(local_guard, work.ledger, totals, options)
    engine = Engine(client, work, totals, options=options, surface=surface,
                    deadline=started + options.seconds, on_progress=on_progress,
                    guard=guard)  # fmt: skip
    await engine.count_in_flight()
    await engine.count_unsaved()
    await engine.learn_from_ledger()
    await anyio.to_thread.run_sync(_sweep_partial_files, work.folder)
    await anyio.to_thread.run_sync(functools.partial(engine.verify_files, hashes=options.verify))
    engine.report_progress(force=True)
    try:
        seconds = options.seconds
        with engine.cancel, anyio.move_on_after(seconds if math.isfinite(seconds) else None):
            async with anyio.create_task_group() as group:
                for _ in range(options.concurrency):
                    group.start_soon(engine.downloader)
                await engine.feed(group)
                await engine.all_done()
                group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            manifest = await anyio.to_thread.run_sync(engine.finish)
    if engine.fatal is not None:
        raise engine.fatal
    if engine.no_room is not None:  # what was in flight is saved; the disk is what to fix
        raise engine.no_room
    engine.report_progress(force=True)
    return BatchReport(
        counts={state: n for state, n in engine.counts.items() if n},
        bad_lines=plan.bad,
        changed_lines=plan.changed,
        manifest=manifest,
        elapsed=time.monotonic() - started,
        credits=engine.credits,
        cost=round(engine.cost, 6),
        bad_count=plan.bad_count,
        changed_count=plan.changed_count,
        removed_lines=plan.removed,
        removed_count=plan.removed_count,
        bad_lines_file=plan.bad_file,
        previous_surface=plan.previous_surface,
        cost_unknown=engine.cost_unknown,
        stopped_by=engine.stopped_by,
        stop_reason=engine.stop_reason,
        max_credits=options.max_credits,
        max_cost=options.max_cost,
        max_failures=options.max_failures,
        comments=plan.comments,
    )
