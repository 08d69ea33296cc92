"""The batch engine: every line of a planned run scheduled through submit -> wait -> download,
bounded, resumable, with memory that does not grow with the number of lines. A single run, a
shard and a shard on a Dask worker all run here; they differ only in their ``Workspace``
(``_workspace``: where the run works and where its results belong).

Rows stream from the ledger in line order into a bounded window of lines in flight: a line
with no task id is submitted with its key (after a crash the gateway replays the task), known
task ids are waited on (never resubmitted: a key older than the gateway's memory must not be
resent blindly), and finished tasks queue for download slots, the soonest-expiring first
(``_downloads``). Every state change goes through ``RunLines.move`` (``_run``, with what a
failure means for a line), which holds it to ``_states.MOVES``; ``_progress`` tells how it goes.

A line is waited on for at most ``line_timeout``. No submit goes out without room on the disk
for the results of every line in flight and its own (``_room``), nor after the gateway refused
one for want of credits, nor past a guard (``_guards``: spend caps, failures).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from .. import _telemetry
from .._async_client import AsyncClient
from .._core.config import check_surface
from .._core.exceptions import (
    ImggwError,
    InsufficientCreditsError,
    NotFoundError,
    TaskFailedError,
    WaitTimeoutError,
)
from .._core.models import Submission, Task, TaskStatus
from .._core.surfaces import REDACTED
from .._files import StorageError
from ._downloads import Downloads, kept_links
from ._guards import Guard, LocalGuard
from ._ledger import NOT_FOUND, Ledger, Totals
from ._lines import COLLECT
from ._options import BatchOptions
from ._plan import Plan, plan_run
from ._progress import Progress, learn_from_ledger
from ._reports import BatchProgress, BatchReport
from ._room import Room
from ._run import FATAL, RunLines, retry_later
from ._schema import Row
from ._spending import Caps, Charge, Spending, reported, settles
from ._states import DOWNLOADING, FINAL, PENDING, RUNNING
from ._workspace import Workspace

__all__ = ["execute"]

NOT_FOUND_TRIES = 4  # queries of a just-submitted task the gateway says it does not know
MIN_IN_FLIGHT = 1024  # lines in flight (submitted, waiting, queued for download) at most ...
IN_FLIGHT_PER_SLOT = 64  # ... or this many per unit of concurrency, whichever is more


class _NotSent(Exception):
    """A submit that waited for its slot while the run stopped submitting: it is not sent."""


class Engine:
    """One run over a planned ledger: the lines in flight and their steps, under the run's
    guard, room and time."""

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
        self.work = work
        self.ledger = work.ledger
        self.options = options
        self.surface = surface
        self.room = Room(work.folder, flying=lambda: self.run.unsaved)
        self.run = RunLines(work.ledger, totals, self.room, deadline=deadline,
                            line_timeout=options.line_timeout, redact=client.redact)  # fmt: skip
        self.downloads = Downloads(client, self.run, work, surface, options.template)
        self.progress = Progress(on_progress, client, self.run, self.downloads.queue, options,
                                 surface)  # fmt: skip
        self.run.on_move = self.progress.report
        self.stop_noted = False
        self.submits = anyio.CapacityLimiter(options.concurrency)
        # With guards, at most `concurrency` lines are between their guards' yes and their
        # submit's answer; without, nothing waits for one.
        guarded = options.caps != Caps()
        self.admitting = anyio.CapacityLimiter(options.concurrency) if guarded else None
        window = max(MIN_IN_FLIGHT, options.concurrency * IN_FLIGHT_PER_SLOT)
        self.in_flight = anyio.Semaphore(window)
        self.active = 0
        self.idle = anyio.Event()

    async def charge(self, row: Row, task: Task, *, final: bool) -> None:
        """What the line's task reports it cost, as soon as any answer states it: the run's
        money, the row, and the guard (a cap is kept by charges, not by guesses). While the
        task runs its charge never drops (``_spending.reported``)."""
        before = Charge(row.credits, row.cost).clamped()
        now = reported(before, Charge(task.credits, task.cost), final=final)
        if now != before and now.known:
            self.run.charged(before, now)
            row.credits, row.cost = now.credits, now.cost
            if not final:  # the line's state will not move yet: keep the charge now
                self.ledger.save(row)
        if row.kind != COLLECT and (now != before or final):
            resolution = str(row.fields.get("resolution", ""))
            failed = task.status is TaskStatus.FAILED
            await self.guard.charged(row.identity, resolution, before, now, final=final,
                                     failed=failed)  # fmt: skip

    # ------------------------------------------------------------------------ lines

    async def feed(self, group: anyio.abc.TaskGroup) -> None:
        """Streams unfinished rows from the ledger into the window of lines in flight."""
        after = 0
        while self.run.fatal is None:
            chunk = await anyio.to_thread.run_sync(self.ledger.next_rows, after)
            if not chunk:
                return
            after = chunk[-1].line
            for row in chunk:
                if row.state in FINAL or (self.run.stopped and row.state is PENDING):
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
                    working, self.room.working = True, self.room.working + 1
                if row.state is RUNNING:
                    await self.wait(row)
                if row.state is DOWNLOADING:
                    await self.downloads.download(row)
        except FATAL as err:
            self.run.stop(err)
        except Exception as exc:  # one line's fault must not end the run
            self.run.unexpected_fault(row, exc)
        finally:
            if working:
                self.room.working -= 1
                self.room.changed()  # a line waiting for room may stop waiting
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
        resolution = str(row.fields.get("resolution", ""))
        # Lines queued for a submit slot must not all pass the guards at once, before the
        # failures and charges of those ahead are known.
        async with self.admitting or contextlib.nullcontext():
            if self.run.stopped:
                return  # no more submits: the line waits for a rerun, with its key
            if not await self.room.reserve(row, stopped=lambda: self.run.stopped):
                if self.room.no_room is not None and not self.run.stopped:
                    self.run.stopped = True  # nothing in flight would give room back
                    self.progress.report(force=True)
                return  # no room for its result: the line waits for a rerun, with its key
            try:
                if not await self.guard.admit(row.identity, resolution):
                    await self.note_stop()
                    return  # a guard stopped new submits: the line waits for a rerun
                await self.send(row)
            finally:
                self.room.release(row)  # a line sent counts in the room of lines in flight

    async def send(self, row: Row) -> None:
        fields, run = row.fields, self.run
        try:
            async for attempt in run.retrying(run.line_deadline()):
                with attempt:
                    async with self.submits:
                        if run.stopped:  # the run stopped while this line waited its turn
                            raise _NotSent
                        try:
                            sub = await self.client.submit(
                                fields["prompt"],
                                aspect_ratio=fields["aspect_ratio"],
                                resolution=fields["resolution"],
                                surface=check_surface(row.surface),
                                idempotency_key=row.idempotency_key,
                            )
                        except InsufficientCreditsError:
                            run.stopped = True  # before its slot is free: none goes after it
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
            if not retry_later(err):  # refused: nothing made, nothing charged
                await self.guard.release(row.identity)
                await self.guard.failed(err.code or "refused")
                run.fail(row, err.code or "refused", err.message)
            return  # out of time: the line stays pending; its key resumes it (still counted)
        row.task_id = sub.task_id
        # A replayed task started earlier, when is not known: it teaches no duration.
        row.submitted_at = sub.submitted_at.timestamp() if sub.submitted_at else None
        run.move(row, RUNNING)

    async def note_stop(self) -> None:
        """A guard refused a submit, or the gateway one for want of credits: no more are tried
        in this run, and the guard's word on why is kept for the report."""
        self.run.stopped = True
        if not self.stop_noted:
            self.stop_noted = True
            state = await self.guard.state()
            self.run.stopped_by, self.run.stop_reason = state.stopped_by, state.why
            self.progress.report(force=True)  # a display says so at once, not at the next line

    async def wait(self, row: Row) -> None:
        run = self.run
        if run.remaining() <= 0:
            return
        until = run.line_deadline()
        try:
            task = await self.query(row, until)
        except WaitTimeoutError:  # still running: a later run resumes the wait
            if until < run.deadline:
                limit = self.options.line_timeout
                run.left_for_next_run(row, f"its task still runs after {limit:g} s")
            return
        except TaskFailedError as err:
            task = err.task
        except FATAL:
            raise
        except NotFoundError as err:  # its own line fails, no more; the next run looks again
            run.fail(row, NOT_FOUND, err.message)
            return
        except ImggwError as err:
            # A query refused (a 402 once the balance is spent, a proxy's 400) or failing (5xx,
            # the network) says nothing of the task: the paid line is asked about again.
            run.left_for_next_run(row, f"its status query failed ({run.why(err)})")
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
            run.fail(row, code, error.message if error else "")
            return
        row.urls = kept_links(self.client, task.image_urls)
        row.expires_at = task.expires_at.timestamp() if task.expires_at else None
        run.move(row, DOWNLOADING)

    async def query(self, row: Row, until: float) -> Task:
        """The task of a submitted line: waited on until it ends (or ``until``: the line
        timeout or the run's deadline), or asked once (collect without waiting). A task the
        gateway has just made may not be visible everywhere behind it yet: a NotFound for a
        line submitted by a run is asked again a few times, at the client's backoff, before it
        counts."""
        assert row.task_id is not None
        policy = self.client.retry
        tries = NOT_FOUND_TRIES if row.kind != COLLECT else 1
        out_of_time = self.run.out_of_time(until)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(NotFoundError),
            wait=wait_random_exponential(multiplier=policy.initial_backoff, max=policy.max_backoff),
            stop=lambda state: state.attempt_number >= tries or out_of_time(state),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                if not self.options.wait:
                    return await self.client.get(row.task_id, surface=check_surface(row.surface))
                remaining = max(0.0, until - time.monotonic())

                async def seen(task: Task) -> None:  # a charge is kept as soon as it shows
                    if not task.is_terminal:
                        await self.charge(row, task, final=False)

                return await self.client.wait(_waited(row), surface=check_surface(row.surface),
                                              wait_timeout=remaining, on_update=seen)  # fmt: skip
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    # ------------------------------------------------------------------------ before and after

    def verify_files(self, *, hashes: bool) -> None:
        """Saved lines whose files are missing or damaged go back to be downloaded again: a
        size check by default, every file's sha256 with ``hashes``. Such a line keeps its list
        of files until it is saved again: that it was saved once tells a result gone at the
        gateway from one that expired before its download. Blocking; before the run."""
        for row in self.work.damaged(hashes=hashes):
            self.run.move(row, DOWNLOADING, at_once=True)

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

    def finish(self) -> Path:
        """Everything saved, the manifest and the gallery written: also after a crash of the
        run (an interrupted run's manifest shows where it stopped). Blocking."""
        try:
            self.ledger.flush()
        except StorageError as err:
            self.run.fatal = self.run.fatal or err
        return self.work.write_outputs(self.run.stopped_by)

    def report(self, plan: Plan, manifest: Path, elapsed: float) -> BatchReport:
        """What the run did, for its caller."""
        run, options = self.run, self.options
        return BatchReport(
            counts={state: n for state, n in run.counts.items() if n},
            bad_lines=plan.bad, changed_lines=plan.changed, manifest=manifest, elapsed=elapsed,
            credits=run.credits, cost=round(run.cost, 6), bad_count=plan.bad_count,
            changed_count=plan.changed_count, removed_lines=plan.removed,
            removed_count=plan.removed_count, bad_lines_file=plan.bad_file,
            previous_surface=plan.previous_surface, cost_unknown=run.cost_unknown,
            stopped_by=run.stopped_by, stop_reason=run.stop_reason,
            max_credits=options.max_credits, max_cost=options.max_cost,
            max_failures=options.max_failures, comments=plan.comments,
        )  # fmt: skip


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
    scheduler).

    Example::

        report = await execute("prompts.jsonl", work, client=client, options=BatchOptions())
    """
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
    await engine.room.count_unsaved(work.ledger)
    await learn_from_ledger(client, work.ledger)
    await anyio.to_thread.run_sync(work.sweep_partial_files)
    await anyio.to_thread.run_sync(functools.partial(engine.verify_files, hashes=options.verify))
    engine.progress.report(force=True)
    try:
        seconds = options.seconds
        with engine.run.cancel, anyio.move_on_after(seconds if math.isfinite(seconds) else None):
            async with anyio.create_task_group() as group:
                for _ in range(options.concurrency):
                    group.start_soon(engine.downloads.slot)
                group.start_soon(engine.progress.tick)
                await engine.feed(group)
                await engine.all_done()
                group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            manifest = await anyio.to_thread.run_sync(engine.finish)
    if engine.run.fatal is not None:
        raise engine.run.fatal
    if engine.room.no_room is not None:  # what was in flight is saved; the disk is what to fix
        raise engine.room.no_room
    engine.progress.report(force=True)
    return engine.report(plan, manifest, time.monotonic() - started)
