"""The batch runner: every line through submit -> wait -> download, bounded, resumable, with
memory that does not grow with the number of lines.

Before anything is sent, one pass over the input plans the run: bad lines, repeated ids and
(against the folder's record of its input) changed lines stop it, unless told otherwise; every
line gets its ledger row and its idempotency key, a pure function of the run's identity. Then
rows stream from the ledger in line order into a bounded window of lines in flight: a line with
no task id is submitted with its key (after a crash the gateway replays the task), known task
ids are waited on (never resubmitted: a key older than the gateway's memory must not be resent
blindly), and finished tasks queue for download slots, the soonest-expiring first. A dead link
is queried again for a fresh one before a result is declared expired.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import itertools
import json
import logging
import math
import os
import secrets
import sqlite3
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_exception_type,
    wait_random_exponential,
)

from .._async_client import AsyncClient
from .._config import RateLimit, check_surface
from .._core.flows import NOT_AN_IMAGE
from .._core.retry import classify
from .._core.surfaces import safe_message
from .._download import WRITE_FAILED
from .._exceptions import (
    AuthenticationError,
    ConfigurationError,
    DownloadError,
    ImggwError,
    InsufficientCreditsError,
    NotFoundError,
    PermissionDeniedError,
    RequestValidationError,
    ResultExpiredError,
    TaskFailedError,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from .._models import DownloadedFile, Task, TaskStatus
from . import _identity
from ._gallery import write_gallery
from ._input import (
    BAD_LINES_NAME,
    COLLECT,
    SHOWN_BAD_LINES,
    BadLine,
    BatchInputError,
    InputLine,
    iter_lines,
)
from ._ledger import (
    DONE,
    EXPIRED,
    FAILED,
    FINAL,
    INVALID_LINE,
    LOCK_NAME,
    NOT_FOUND,
    PENDING,
    SUBMITTED,
    SUCCEEDED,
    Ledger,
    Row,
    StorageError,
    Totals,
    storage_error,
)
from ._storage import destination_name

MANIFEST_NAME = "manifest.jsonl"
log = logging.getLogger("imggw_client")
NOT_FOUND_TRIES = 4  # queries of a just-submitted task the gateway says it does not know
UNEXPECTED_LOGGED = 20  # faults no rule covers, logged one by one; the rest are counted
# Failures that doom every line alike: the run stops, and its unfinished lines wait for a rerun
# (a submit answered 404, a base URL with a wrong path, is a ConfigurationError: nothing was
# made, nothing billed, and the same command with the right URL resumes every line).
FATAL = (
    AuthenticationError,
    PermissionDeniedError,
    InsufficientCreditsError,
    ConfigurationError,
    StorageError,
)
RETRY_PAUSE = (0.5, 10.0)  # first and longest pause before a line's step is tried again
MIN_IN_FLIGHT = 1024  # lines in flight (submitted, waiting, queued for download) at most ...
IN_FLIGHT_PER_SLOT = 64  # ... or this many per unit of concurrency, whichever is more
PROGRESS_EVERY = 0.25  # seconds between progress snapshots
GALLERY_EVERY = 30.0  # seconds between gallery rewrites during a run (and at least 20x its cost)
BAD_LINES_KEPT = 1000


@dataclass(frozen=True)
class BatchProgress:
    """A snapshot for progress displays: counts per state, money, speed, the request budget and
    the results waiting for download.

    ``rate_limit`` is the client's budget; ``least_time_left`` the fewest seconds it allows for
    the lines not yet submitted (None without a submit ceiling). ``awaiting_download`` counts
    finished results waiting for a download slot, ``soonest_expiry`` is the earliest link
    expiry among them, and ``at_risk`` how many of them will, at the current pace, expire
    before their turn. ``cost_unknown`` counts lines charged whose gateway stated no cost
    (surface alpha states credits only): ``cost`` leaves them out.

    Example::

        run_batch("prompts.jsonl", "out/", on_progress=lambda p: print(p.counts, p.eta))
    """

    total: int
    counts: dict[str, int]
    credits: float
    cost: float
    elapsed: float
    finished_this_run: int
    rate_limit: RateLimit | None = None
    least_time_left: float | None = None
    awaiting_download: int = 0
    soonest_expiry: datetime | None = None
    at_risk: int = 0
    cost_unknown: int = 0

    @property
    def finished(self) -> int:
        return sum(self.counts.get(state, 0) for state in FINAL)

    @property
    def throughput(self) -> float:
        """Lines finished per second in this run."""
        return self.finished_this_run / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds until every line is finished at the current pace, if it can be told."""
        left = self.total - self.finished
        return left / self.throughput if self.throughput > 0 else None


@dataclass
class BatchReport:
    """What a run did. ``exit_code``: 0 all succeeded, 3 some still unfinished (run again to
    resume), 1 some failed, expired or were bad input.

    ``bad_lines`` and ``changed_lines`` hold the first ones (up to 1,000); ``bad_count`` and
    ``changed_count`` count them all. ``changed_lines`` are the lines run as new requests (new
    or changed since the folder's run, with ``allow_changes``); ``removed_lines`` (and
    ``removed_count``) the lines the run's input had and this one has not, numbered as they
    were. ``bad_lines_file`` lists every bad line when there are more than 10.
    ``previous_surface`` is the surface the folder's run was made on when this one moved it to
    another (with ``allow_changes``). ``cost_unknown`` counts lines charged whose gateway
    stated no cost: ``cost`` leaves them out.

    Example::

        report = run_batch("prompts.jsonl", "out/")
        print(report.counts, report.credits, report.manifest)
    """

    counts: dict[str, int]
    bad_lines: list[BadLine]
    changed_lines: list[int]
    manifest: Path
    elapsed: float
    credits: float = 0.0
    cost: float = 0.0
    bad_count: int = 0
    changed_count: int = 0
    removed_lines: list[int] = field(default_factory=list)
    removed_count: int = 0
    bad_lines_file: Path | None = None
    previous_surface: str | None = None
    cost_unknown: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def exit_code(self) -> int:
        if any(n for state, n in self.counts.items() if state not in FINAL):
            return 3
        if self.bad_count or any(n for state, n in self.counts.items() if state != DONE):
            return 1
        return 0


# One word per line state, the same in the manifest, `imggw batch status` and the display: a
# line's status says what the line delivered. `succeeded` is a line whose files are saved; a
# line whose task succeeded but whose files are not saved yet is `running` (the display says
# `downloading`): its work is unfinished and a rerun finishes it; a line whose results expired
# before they could be saved is `failed` with the error `result_expired`: it delivered
# nothing, and the exit code counts it as a failure.
_STATUS = {
    PENDING: TaskStatus.PENDING,
    SUBMITTED: TaskStatus.RUNNING,
    SUCCEEDED: TaskStatus.RUNNING,
    DONE: TaskStatus.SUCCEEDED,
    EXPIRED: TaskStatus.FAILED,
    FAILED: TaskStatus.FAILED,
}


def manifest_record(row: Row) -> dict[str, Any]:
    """One manifest line: DESIGN 7's pinned fields (``line``, ``task_id``, ``status``,
    ``files``, ``error``), then the caller's ``id``, the request, money and link expiry.
    ``files`` lists the files of a saved line only (a line waiting to download them again
    may remember files that are gone)."""
    error = None
    if row.error_code is not None:
        error = {"code": row.error_code, "message": row.error_message or ""}
    expires = None
    if row.expires_at is not None:
        moment = datetime.fromtimestamp(row.expires_at, tz=timezone.utc)
        expires = moment.isoformat().replace("+00:00", "Z")
    return {
        "line": row.line,
        "task_id": row.task_id,
        "status": _STATUS[row.state].value,
        "files": row.files if row.state == DONE else [],
        "error": error,
        "id": row.caller_id,
        "surface": row.surface,
        "prompt": row.fields.get("prompt"),
        "aspect_ratio": row.fields.get("aspect_ratio"),
        "resolution": row.fields.get("resolution"),
        "cost": row.cost,
        "credits": row.credits,
        "expires_at": expires,
    }


def _cost_unknown(credits: float | None, cost: float | None) -> int:
    """1 for a line charged in credits with no cost stated (as Totals.cost_unknown counts)."""
    return int(credits is not None and cost is None)


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


# Downloads that another try in this run would not mend (a rerun looks at a document's link
# again: what a proxy served today may be the image tomorrow).
_FINAL_DOWNLOAD_CODES = frozenset({"result_too_large", WRITE_FAILED, NOT_AN_IMAGE})


def _retry_later(err: BaseException) -> bool:
    """A failure after which a line is tried again later instead of failing: what the core
    retries, and an unknown submit outcome (the line's key makes another try safe)."""
    if not isinstance(err, ImggwError) or isinstance(err, FATAL):
        return False
    if isinstance(err, DownloadError) and err.code in _FINAL_DOWNLOAD_CODES:
        return False
    return isinstance(err, (UnknownOutcomeError, DownloadError)) or classify(err).retry


# ---------------------------------------------------------------------------- the plan


class Record(Protocol):
    """Where a run's identity is kept: the run id every key follows from, and the record of the
    input the plan compares with (a single run's folder, or a shard's; see ``_shards``)."""

    run_id: str

    def previous_surface(self) -> str | None:
        """The surface the run was made on, if the record tells it."""

    def digests(self) -> _identity.LineDigests:
        """A comparison of the input with the record, written beside it until accepted."""

    def accept(self, digests: _identity.LineDigests, fingerprint: str) -> None:
        """The plan goes: keep what it compared as the record (before anything is sent)."""


class FolderRecord:
    """A single run's identity, in its output folder: ``run.json`` and ``lines.fp``. A folder
    with no ``run.json`` gets the run id ``derive`` makes (the same for the same folder,
    gateway and key: a folder made again replays its tasks), or a random one with
    ``new_run`` (refused where a run is already kept: that folder's lines have their keys)."""

    def __init__(
        self,
        folder: Path,
        *,
        surface: str,
        derive: Callable[[], str] | None = None,
        new_run: bool = False,
    ) -> None:
        self.folder = folder
        self.surface = surface
        self.run = _identity.load(folder)
        if new_run and self.run is not None:
            raise RequestValidationError(
                "out_dir",
                f"{folder} holds a run already ({_identity.RUN_NAME}): --new-run (new_run=True) "
                "starts one only in a folder without one; use another folder; nothing was sent",
                code="run_exists",
            )
        if self.run is not None:
            self.run_id = self.run.run_id
        elif new_run or derive is None:
            self.run_id = _identity.random_run_id()
        else:
            self.run_id = derive()

    def previous_surface(self) -> str | None:
        return self.run.surface if self.run is not None else None

    def digests(self) -> _identity.LineDigests:
        return _identity.LineDigests(self.folder)

    def accept(self, digests: _identity.LineDigests, fingerprint: str) -> None:
        run = self.run
        if run is None or run.input_fingerprint != fingerprint or run.surface != self.surface:
            # Before anything is sent: the keys of every line follow from this run id.
            identity = _identity.RunIdentity(self.run_id, fingerprint, self.surface)
            _identity.save(self.folder, identity)
            digests.commit()


class ResultStore(Protocol):
    """Where results and the manifest go when they are not simply left in the run's folder (a
    shard: the output folder shared by every shard, maybe on an object store)."""

    async def keep(self, files: list[DownloadedFile]) -> None:
        """Puts files just saved and verified in the run's folder in their place."""

    def is_whole(self, name: str, size: int, sha256: str, *, hashes: bool) -> bool:
        """Whether a result kept earlier is there and whole (blocking)."""

    def finish(self, manifest: Path) -> None:
        """The run ends: its ledger is flushed and its manifest written (blocking)."""


@dataclass
class _Plan:
    ledger: Ledger
    bad: list[BadLine] = field(default_factory=list)
    bad_count: int = 0
    bad_file: Path | None = None
    changed: list[int] = field(default_factory=list)
    changed_count: int = 0
    removed: list[int] = field(default_factory=list)
    removed_count: int = 0
    previous_surface: str | None = None


class _BadLines:
    """Every bad line of a plan, written as they come to a temp file in the folder (a million
    of them need no memory), kept whole as ``bad-lines.txt`` when there are more than the
    messages name; a listing left by an earlier run goes."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / BAD_LINES_NAME
        self._tmp = folder / f".{BAD_LINES_NAME}.{secrets.token_hex(4)}.part"
        self._out: Any = None

    def add(self, bad: BadLine) -> None:
        if self._out is None:
            self._out = self._tmp.open("w", encoding="utf-8")
        self._out.write(f"line {bad.line}: {bad.reason}\n")

    def finish(self, count: int) -> Path | None:
        if self._out is not None:
            self._out.close()
        if count <= SHOWN_BAD_LINES:
            self._tmp.unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)
            return None
        os.replace(self._tmp, self.path)
        return self.path

    def discard(self) -> None:
        if self._out is not None and not self._out.closed:
            self._out.close()
        self._tmp.unlink(missing_ok=True)


def _plan(
    source: Any,
    folder: Path,
    ledger: Ledger,
    *,
    surface: str,
    collect: bool,
    skip_bad_lines: bool,
    allow_changes: bool,
    format: str | None = None,
    record: Record | None = None,
    derive: Callable[[], str] | None = None,
    new_run: bool = False,
    lines: range | None = None,
    first_line: int = 1,
    first_entry: int = 1,
) -> _Plan:
    """One pass over the input, in one ledger transaction that commits only if the run may go:
    no bad line (unless skipped) and no changed line (unless allowed). Blocking: run it in a
    worker thread. ``record`` keeps the run's identity (default: the folder's, a new one's id
    made by ``derive``, or random with ``new_run``); ``lines``, ``first_line`` and
    ``first_entry`` as in :func:`iter_lines` (a shard)."""
    if record is None:
        record = FolderRecord(folder, surface=surface, derive=derive, new_run=new_run)
    plan = _Plan(ledger)
    previous = record.previous_surface()
    if previous is None and isinstance(record, FolderRecord):
        # A run.json written before runs kept their surface: the ledger tells it.
        kept = ledger.last_surfaces()
        previous = kept.pop() if len(kept) == 1 else None
    if previous is not None and previous != surface:
        if not allow_changes:  # every line a new request: one fact, not a list of lines
            raise _identity.InputChangedError([], 0, surfaces=(previous, surface))
        plan.previous_surface = previous
    digests = record.digests()
    run_id = record.run_id
    listing = _BadLines(folder)
    ledger.begin_plan()
    ok = False
    try:
        items = iter_lines(
            source, collect=collect, format=format, lines=lines, first_line=first_line,
            first_entry=first_entry,
        )  # fmt: skip
        for item in items:
            if isinstance(item, InputLine):
                row = _new_row(item, surface, run_id)
                if ledger.plan_line(row) is None:
                    item = BadLine(item.line, f"{row.identity.split(':', 1)[0]} repeats an "
                                   f"earlier line")  # fmt: skip
                else:
                    digests.add(item.line, _identity.line_digest(row.identity, row.fingerprint))
                    continue
            plan.bad_count += 1
            if len(plan.bad) < BAD_LINES_KEPT:
                plan.bad.append(item)
            listing.add(item)
            ledger.plan_line(_bad_row(item, surface))
        fingerprint = digests.finish()
        plan.changed, plan.changed_count = digests.added, digests.added_count
        plan.removed, plan.removed_count = digests.removed, digests.removed_count
        plan.bad_file = listing.finish(plan.bad_count)
        if plan.bad_count and not skip_bad_lines:
            raise BatchInputError(plan.bad, plan.bad_count, listing=plan.bad_file)
        if digests.changed_count and not allow_changes:
            raise _identity.InputChangedError(
                plan.changed, plan.changed_count, removed=plan.removed,
                removed_count=plan.removed_count,
            )  # fmt: skip
        record.accept(digests, fingerprint)
        ledger.recheck()
        ok = True
    except (OSError, sqlite3.Error) as exc:  # a full or failing disk, while planning
        raise storage_error(folder, exc) from exc
    finally:
        ledger.end_plan(commit=ok)
        digests.discard()
        listing.discard()
    return plan


def _new_row(item: InputLine, default_surface: str, run_id: str) -> Row:
    surface = check_surface(item.surface or default_surface)
    fingerprint = item.fingerprint(default_surface)
    identity = item.identity(default_surface)
    key = None
    if item.kind != COLLECT:
        key = _identity.idempotency_key(run_id, identity, fingerprint)
    return Row(
        identity=identity,
        line=item.line,
        caller_id=item.caller_id,
        kind=item.kind,
        fingerprint=fingerprint,
        fields=item.fields,
        surface=surface,
        idempotency_key=key,
        task_id=item.task_id,
        state=SUBMITTED if item.kind == COLLECT else PENDING,
    )


def _bad_row(bad: BadLine, surface: str) -> Row:
    return Row(
        identity=f"bad:{bad.line}", line=bad.line, caller_id=None, kind="bad",
        fingerprint=hashlib.sha256(bad.reason.encode()).hexdigest(), fields={}, surface=surface,
        idempotency_key=None, task_id=None, state=FAILED, error_code=INVALID_LINE,
        error_message=bad.reason,
    )  # fmt: skip


# ---------------------------------------------------------------------------- the run


@dataclass(order=True)
class _Queued:
    """A finished task waiting for a download slot: soonest expiry first, then (unknown
    expiry) in the order they finished."""

    expires: float
    seq: int
    row: Row = field(compare=False)
    done: anyio.Event = field(compare=False)


class _Run:
    def __init__(
        self,
        client: AsyncClient,
        ledger: Ledger,
        folder: Path,
        totals: Totals,
        *,
        concurrency: int,
        deadline: float,
        wait: bool,
        on_progress: Callable[[BatchProgress], None] | None,
        gallery_title: str | None,
        surface: str,
        store: ResultStore | None = None,
    ) -> None:
        self.client = client
        self.surface = surface
        self.store = store
        self.ledger = ledger
        self.folder = folder
        self.counts = totals.counts
        self.credits, self.cost = totals.credits, totals.cost
        self.cost_unknown = totals.cost_unknown
        self.total = sum(self.counts.values())
        self.deadline = deadline
        self.wait_for_tasks = wait
        self.on_progress = on_progress
        self.gallery_title = gallery_title
        self.concurrency = concurrency
        self.submits = anyio.CapacityLimiter(concurrency)
        self.in_flight = anyio.Semaphore(max(MIN_IN_FLIGHT, concurrency * IN_FLIGHT_PER_SLOT))
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
        )

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

    def move(self, row: Row, state: str, *, billed: Task | None = None) -> None:
        """Changes the row's state, keeps the counts, and queues the row for the ledger."""
        if billed is not None:
            self.credits += (billed.credits or 0) - (row.credits or 0)
            self.cost += (billed.cost or 0) - (row.cost or 0)
            self.cost_unknown += _cost_unknown(billed.credits, billed.cost)
            self.cost_unknown -= _cost_unknown(row.credits, row.cost)
            row.credits, row.cost = billed.credits, billed.cost
        self.counts[row.state] -= 1
        self.counts[state] += 1
        row.state = state
        if state in FINAL:
            self.finished_here += 1
            row.finished_at = time.time()
        self.ledger.save(row)
        self.report_progress()

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
        secret = (self.client._settings.api_key,)
        log.error(
            "line %d: unexpected %s%s: %s; the line stays unfinished for the next run%s",
            row.line, type(exc).__name__, where, safe_message(str(exc), secret) or "",
            "; later ones are counted, not logged" if self.unexpected == UNEXPECTED_LOGGED else "",
        )  # fmt: skip

    # ------------------------------------------------------------------------ retries

    def out_of_time(self, state: RetryCallState) -> bool:
        """A tenacity stop: the run ends (its deadline, or a failure that ends it) before the
        next try would go."""
        return self.fatal is not None or (state.upcoming_sleep or 0) >= self.remaining()

    def retrying(self) -> AsyncRetrying:
        """A line's step tried again after failures worth waiting out, until the run's
        deadline (or a failure that ends the run)."""
        return AsyncRetrying(
            retry=retry_if_exception(_retry_later),
            wait=wait_random_exponential(multiplier=RETRY_PAUSE[0], max=RETRY_PAUSE[1]),
            stop=self.out_of_time,
            reraise=True,
        )

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
                if row.state in FINAL:
                    continue
                await self.in_flight.acquire()
                self.active += 1
                group.start_soon(self.line, row)

    async def line(self, row: Row) -> None:
        try:
            if row.state == PENDING:
                await self.submit(row)
            if row.state == SUBMITTED:
                await self.wait(row)
            if row.state == SUCCEEDED:
                await self.download(row)
        except FATAL as err:
            self.stop(err)
        except Exception as exc:  # one line's fault must not end the run
            self.unexpected_fault(row, exc)
        finally:
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
        try:
            async for attempt in self.retrying():
                with attempt:
                    async with self.submits:
                        sub = await self.client.submit(
                            fields["prompt"],
                            aspect_ratio=fields["aspect_ratio"],
                            resolution=fields["resolution"],
                            surface=row.surface,
                            idempotency_key=row.idempotency_key,
                        )
        except FATAL:
            raise
        except ImggwError as err:
            if not _retry_later(err):
                self.fail(row, err.code or "refused", err.message)
            return  # out of time: the line stays pending; its key resumes it
        row.task_id = sub.task_id
        self.move(row, SUBMITTED)

    async def wait(self, row: Row) -> None:
        assert row.task_id is not None
        remaining = self.remaining()
        if remaining <= 0:
            return
        try:
            task = await self.query(row)
        except WaitTimeoutError:
            return  # still running: a later run resumes the wait
        except TaskFailedError as err:
            error = err.task.error
            row.error_code = error.code if error else "failed"
            row.error_message = error.message if error else ""
            self.move(row, FAILED, billed=err.task)
            return
        except FATAL:
            raise
        except NotFoundError as err:  # its own line fails, no more; the next run looks again
            self.fail(row, NOT_FOUND, err.message)
            return
        except ImggwError as err:
            if not _retry_later(err):
                self.fail(row, err.code or "query_failed", err.message)
            return
        if task.status is TaskStatus.FAILED:
            error = task.error
            row.error_code = error.code if error else "failed"
            row.error_message = error.message if error else ""
            self.move(row, FAILED, billed=task)
            return
        if task.status is not TaskStatus.SUCCEEDED:
            return  # unfinished, and not waited on (collect without --wait)
        row.urls = list(task.image_urls)
        row.expires_at = task.expires_at.timestamp() if task.expires_at else None
        self.move(row, SUCCEEDED, billed=task)

    async def query(self, row: Row) -> Task:
        """The task of a submitted line: waited on until it ends (or the run's deadline), or
        asked once (collect without waiting). A task the gateway has just made may not be
        visible everywhere behind it yet: a NotFound for a line submitted by a run is asked
        again a few times, at the client's backoff, before it counts."""
        assert row.task_id is not None
        policy = self.client._settings.retry
        tries = NOT_FOUND_TRIES if row.kind != COLLECT else 1
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(NotFoundError),
            wait=wait_random_exponential(multiplier=policy.initial_backoff, max=policy.max_backoff),
            stop=lambda state: state.attempt_number >= tries or self.out_of_time(state),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                if not self.wait_for_tasks:
                    return await self.client.get(row.task_id, surface=row.surface)
                remaining = max(0.0, self.remaining())
                return await self.client.wait(row.task_id, surface=row.surface, timeout=remaining)
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    async def download(self, row: Row) -> None:
        """Queues the row for a download slot (soonest expiry first) and waits for its turn."""
        if not row.urls:
            self.fail(row, "no_result", f"task {row.task_id} succeeded without result URLs")
            return
        item = _Queued(row.expires_at or math.inf, next(self.order), row, anyio.Event())
        heapq.heappush(self.queue, item)
        self.queued.release()
        await item.done.wait()

    async def downloader(self) -> None:
        """One download slot: always the queued result whose links die first."""
        while True:
            await self.queued.acquire()
            item = heapq.heappop(self.queue)
            try:
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
            async for attempt in self.retrying():
                with attempt:
                    files = await self.client.download(
                        task, self.folder, overwrite=True, prefix=self.file_prefix(row)
                    )
        except ResultExpiredError as err:  # the fresh links failed too: really gone
            message = err.message
            if row.files:  # saved by an earlier run: it did not expire before its download
                message = (
                    "the files saved earlier are gone from the folder, and the gateway no "
                    f"longer has the result ({message})"
                )
            row.error_code, row.error_message = "result_expired", message
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
        except ImggwError as err:
            if not _retry_later(err):
                self.fail(row, err.code or "download_failed", err.message)
            return  # out of time: a later run downloads it
        if self.store is not None:
            await self.store.keep(files)
        self.downloaded.append(time.monotonic())
        row.urls = [f.url for f in files]
        row.files = [{"path": f.path.name, "sha256": f.sha256, "size": f.size} for f in files]
        self.move(row, DONE)
        await self.maybe_gallery()

    def file_prefix(self, row: Row) -> str:
        """Task ids are per surface: a task of the other surface may share an id with one of
        the run's, so its files' names start with its surface."""
        return "" if row.surface == self.surface else f"{row.surface}-"

    async def maybe_gallery(self) -> None:
        """The gallery, rewritten now and then as lines finish (never more than 5% of the
        time), so a long run can be looked at while it goes."""
        if self.gallery_title is None:
            return
        now = time.monotonic()
        if now - self.last_gallery < max(GALLERY_EVERY, 20 * self.gallery_cost):
            return
        self.last_gallery = now
        await anyio.to_thread.run_sync(self.write_gallery)
        self.gallery_cost = time.monotonic() - now

    def write_gallery(self) -> None:
        assert self.gallery_title is not None
        self.ledger.flush()
        try:
            records = (manifest_record(row) for row in self.ledger.iter_rows())
            write_gallery(self.folder, records, title=self.gallery_title)
        except OSError as exc:
            raise storage_error(self.folder, exc) from exc


# ---------------------------------------------------------------------------- files


def _sweep_partial_files(folder: Path) -> None:
    """Temp files of downloads cut short by a kill: we hold the folder's lock, so no live run
    owns them."""
    for leftover in folder.glob(".*.part"):
        leftover.unlink(missing_ok=True)


def _is_whole(folder: Path, name: str, size: int, sha256: str, *, hashes: bool) -> bool:
    path = folder / name
    try:
        whole = path.stat().st_size == size
    except OSError:
        whole = False
    return whole and (not hashes or file_sha256(path) == sha256)


def _verify_files(
    folder: Path, ledger: Ledger, totals: Totals, *, hashes: bool, store: ResultStore | None = None
) -> None:
    """Lines whose files are missing or damaged go back to be downloaded again: a size check
    by default, every file's sha256 with ``hashes``. Such a line keeps its list of files until
    it is saved again: that it was saved once tells a result gone at the gateway from one that
    expired before its download."""
    for row in ledger.iter_rows(states=(DONE,)):
        for f in row.files:
            if store is not None:
                whole = store.is_whole(f["path"], f["size"], f["sha256"], hashes=hashes)
            else:
                whole = _is_whole(folder, f["path"], f["size"], f["sha256"], hashes=hashes)
            if not whole:
                row.state = SUCCEEDED
                ledger.save_now(row)
                totals.counts[DONE] -= 1
                totals.counts[SUCCEEDED] += 1
                break


def manifest_records(ledger: Ledger) -> Iterator[dict[str, Any]]:
    """The manifest, one record per input line in line order, streamed from the ledger."""
    return (manifest_record(row) for row in ledger.iter_rows())


def write_manifest(folder: Path, records: Iterable[dict[str, Any]]) -> Path:
    """Writes ``manifest.jsonl`` whole or not at all (temp file, then rename)."""
    path = folder / MANIFEST_NAME
    tmp = folder / f".{MANIFEST_NAME}.{os.getpid()}.part"
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise storage_error(path, exc) from exc
    return path


# ---------------------------------------------------------------------------- entry points


def check_run_options(concurrency: object, timeout: object) -> tuple[int, float]:
    """``concurrency`` and ``timeout`` checked before anything is opened or sent; returns them
    as the runner uses them (no timeout: an endless budget)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise RequestValidationError(
            "concurrency", "must be an integer >= 1", code="invalid_concurrency"
        )
    if timeout is None:
        return concurrency, math.inf
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise RequestValidationError(
            "timeout", "must be a finite number of seconds >= 0, or None for no limit",
            code="invalid_option",
        )  # fmt: skip
    return concurrency, float(timeout)


async def arun_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client: AsyncClient,
    concurrency: int = 8,
    timeout: float | None = None,
    surface: str | None = None,
    skip_bad_lines: bool = False,
    allow_changes: bool = False,
    collect: bool = False,
    wait: bool = True,
    verify: bool = False,
    gallery: bool = True,
    on_progress: Callable[[BatchProgress], None] | None = None,
    format: str | None = None,
    new_run: bool = False,
) -> BatchReport:
    """Runs (or resumes) a batch: every line submitted once, waited on, downloaded, verified.

    ``source`` is a JSONL or text file (``-``: standard input), or an iterable of requests
    (``ImageRequest``, dicts with the JSONL fields, or prompts); ``format`` (``"jsonl"`` or
    ``"text"``) says how a file is read when its name does not (see :func:`iter_lines`). A
    line with ``task_id`` names a task made elsewhere: it is collected (waited on and
    downloaded), never submitted; ``collect=True`` reads a list of such tasks (bare ids or
    JSON objects). Bad lines stop the run before anything is sent (:class:`BatchInputError`)
    unless ``skip_bad_lines``; so does an input that changed since the folder's run began, or
    a surface other than its run's (:class:`InputChangedError`), unless ``allow_changes``.
    ``timeout`` bounds the run; what is left unfinished is resumed by the next run with the
    same ``out_dir``. ``wait=False`` leaves unfinished tasks as they are (collect). ``verify``
    checks every saved file's sha256 on resume (default: its size). ``gallery`` writes
    ``index.html`` (as lines finish, and at the end).

    The first run on a folder keeps its run id there; every line's key follows from it. That
    id is derived from the folder, the client's gateway and API key (never kept), so a run on
    a folder deleted and made again sends the same keys, and the gateway replays the tasks it
    still remembers instead of billing them again. ``new_run=True`` makes a random id instead
    (new keys, new tasks), in a folder that holds no run.

    Example::

        async with AsyncClient() as client:
            report = await arun_batch("prompts.jsonl", "out/", client=client, concurrency=16)
    """
    check_run_options(concurrency, timeout)
    folder = Path(out_dir)
    made = not folder.exists()
    try:
        with Ledger.open(folder) as ledger:
            return await execute(
                source, folder, ledger, client=client, concurrency=concurrency,
                timeout=timeout, surface=surface, skip_bad_lines=skip_bad_lines,
                allow_changes=allow_changes, collect=collect, wait=wait, verify=verify,
                gallery=gallery, on_progress=on_progress, format=format, new_run=new_run,
            )  # fmt: skip
    except (BatchInputError, _identity.InputChangedError, RequestValidationError):
        if made:  # refused before anything was kept: no empty folder left behind either
            _remove_if_empty(folder)
        raise


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # never made, or not empty (it lists the bad lines)
        (folder / LOCK_NAME).unlink(missing_ok=True)
        folder.rmdir()


async def execute(
    source: str | Path | Iterable[Any],
    folder: Path,
    ledger: Ledger,
    *,
    client: AsyncClient,
    concurrency: int,
    timeout: float | None,
    surface: str | None,
    skip_bad_lines: bool,
    allow_changes: bool,
    collect: bool,
    wait: bool,
    verify: bool,
    gallery: bool,
    on_progress: Callable[[BatchProgress], None] | None,
    format: str | None = None,
    new_run: bool = False,
    record: Record | None = None,
    lines: range | None = None,
    first_line: int = 1,
    first_entry: int = 1,
    store: ResultStore | None = None,
) -> BatchReport:
    """A run over an open ledger in ``folder``: :func:`arun_batch` for one folder, and each
    shard of a sharded run, with its own ``record`` of the run's identity, its range of
    ``lines`` and its ``store`` for results (see ``_shards``)."""
    started = time.monotonic()
    concurrency, budget = check_run_options(concurrency, timeout)
    run_surface = check_surface(surface or client.surface)

    def derive() -> str:  # once per new run: the key's fingerprint is a slow hash
        place = destination_name(folder)
        return _identity.derive_run_id(place, client.base_url, client.key_fingerprint)

    planning = functools.partial(
        _plan, source, folder, ledger, surface=run_surface, collect=collect,
        skip_bad_lines=skip_bad_lines, allow_changes=allow_changes, format=format,
        record=record, derive=derive, new_run=new_run, lines=lines, first_line=first_line,
        first_entry=first_entry,
    )  # fmt: skip
    try:
        plan = await anyio.to_thread.run_sync(planning)
    except BaseException:
        ledger.discard()  # a refused plan leaves no ledger where there was none
        raise
    totals = ledger.totals()
    await anyio.to_thread.run_sync(_sweep_partial_files, folder)
    await anyio.to_thread.run_sync(
        lambda: _verify_files(folder, ledger, totals, hashes=verify, store=store)
    )
    named = isinstance(source, (str, Path)) and str(source) != "-"
    title = f"imggw batch: {Path(str(source)).name}" if named else "imggw batch"
    run = _Run(client, ledger, folder, totals, concurrency=concurrency,
               deadline=started + budget, wait=wait, on_progress=on_progress,
               gallery_title=title if gallery else None, surface=run_surface,
               store=store)  # fmt: skip
    run.report_progress(force=True)
    try:
        with run.cancel, anyio.move_on_after(budget if math.isfinite(budget) else None):
            async with anyio.create_task_group() as group:
                for _ in range(concurrency):
                    group.start_soon(run.downloader)
                await run.feed(group)
                await run.all_done()
                group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            manifest = await anyio.to_thread.run_sync(lambda: _finish(folder, ledger, run))
    if run.fatal is not None:
        raise run.fatal
    run.report_progress(force=True)
    return BatchReport(
        counts={state: n for state, n in run.counts.items() if n},
        bad_lines=plan.bad,
        changed_lines=plan.changed,
        manifest=manifest,
        elapsed=time.monotonic() - started,
        credits=run.credits,
        cost=round(run.cost, 6),
        bad_count=plan.bad_count,
        changed_count=plan.changed_count,
        removed_lines=plan.removed,
        removed_count=plan.removed_count,
        bad_lines_file=plan.bad_file,
        previous_surface=plan.previous_surface,
        cost_unknown=run.cost_unknown,
    )


def _finish(folder: Path, ledger: Ledger, run: _Run) -> Path:
    """Everything saved, the manifest and the gallery written: also after a crash of the run
    (an interrupted run's manifest shows where it stopped)."""
    try:
        ledger.flush()
    except StorageError as err:
        run.fatal = run.fatal or err
    manifest = write_manifest(folder, manifest_records(ledger))
    if run.gallery_title is not None:
        run.write_gallery()
    if run.store is not None:
        run.store.finish(manifest)
    return manifest


def run_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client_factory: Callable[[], AsyncClient] | None = None,
    concurrency: int = 8,
    timeout: float | None = None,
    surface: str | None = None,
    skip_bad_lines: bool = False,
    allow_changes: bool = False,
    collect: bool = False,
    wait: bool = True,
    verify: bool = False,
    gallery: bool = True,
    on_progress: Callable[[BatchProgress], None] | None = None,
    rate_limit: RateLimit | None = None,
    format: str | None = None,
    new_run: bool = False,
) -> BatchReport:
    """The blocking form of :func:`arun_batch`. ``client_factory`` makes the AsyncClient to use
    (default: ``AsyncClient(rate_limit=rate_limit)`` from ``IMGGW_API_KEY`` /
    ``IMGGW_BASE_URL``); ``rate_limit`` is the request budget of that default client (give
    your factory's client its own).

    Example::

        report = run_batch("prompts.jsonl", "out/", concurrency=16, timeout=3600)
        sys.exit(report.exit_code)
    """
    if client_factory is not None and rate_limit is not None:
        raise RequestValidationError(
            "rate_limit", "give it to the client your client_factory makes", code="invalid_option"
        )

    def make() -> AsyncClient:
        if client_factory is not None:
            return client_factory()
        return AsyncClient(rate_limit=rate_limit)

    async def main() -> BatchReport:
        async with make() as client:
            return await arun_batch(
                source, out_dir, client=client, concurrency=concurrency, timeout=timeout,
                surface=surface, skip_bad_lines=skip_bad_lines, allow_changes=allow_changes,
                collect=collect, wait=wait, verify=verify, gallery=gallery,
                on_progress=on_progress, format=format, new_run=new_run,
            )  # fmt: skip

    return anyio.run(main)


__all__ = [
    "MANIFEST_NAME",
    "BatchProgress",
    "BatchReport",
    "arun_batch",
    "manifest_record",
    "manifest_records",
    "run_batch",
    "write_manifest",
]
