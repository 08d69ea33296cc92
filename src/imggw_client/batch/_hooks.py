"""The batch's hooks on the tracker's loop (``tracking/_store.Hooks``): no submit goes out
without room on the disk for the results of every line in flight and its own (``_room``), nor
after the gateway refused one for want of credits, nor past a guard (``_guards``: spend caps,
failures); every charge a task states is the run's money, the row's and the guard's; a failed
task counts for the guards; a saved line may rewrite the gallery (``GalleryPace``); progress
is told when a guard or the disk stops the submits.

Lines with a ``task_id`` (tasks made elsewhere) pass no guard: collecting bills nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

from .._core.exceptions import ImggwError, InsufficientCreditsError
from .._core.models import Task, TaskStatus
from ._guards import Guard
from ._progress import Progress
from ._room import Room
from ._run import RunLines
from ._schema import Row
from ._spending import Charge, reported
from ._workspace import GalleryPace

__all__ = ["BatchHooks"]


class BatchHooks:
    """The guard, room, money, gallery and progress of one run (see the module's docstring)."""

    def __init__(self, run: RunLines, guard: Guard, room: Room, gallery: GalleryPace) -> None:
        self.run = run
        self.guard = guard
        self.room = room
        self.gallery = gallery
        self.progress: Progress | None = None
        self.stop_noted = False

    def report(self) -> None:
        """Progress told at once (a display says so now, not at the next line)."""
        if self.progress is not None:
            self.progress.report(force=True)

    @contextlib.asynccontextmanager
    async def admit(self, row: Row) -> AsyncIterator[bool]:
        """Room for the line's result, then the guards' yes; the room is held until its
        submit is answered (a line sent counts in the room of lines in flight)."""
        run = self.run
        if not await self.room.reserve(row, stopped=lambda: run.stopped):
            if self.room.no_room is not None and not run.stopped:
                run.stopped = True  # nothing in flight would give room back
                self.report()
            yield False  # no room for its result: the line waits for a rerun, with its key
            return
        try:
            resolution = str(row.fields.get("resolution", ""))
            if not await self.guard.admit(row.identity, resolution):
                await self.note_stop()
                yield False  # a guard stopped new submits: the line waits for a rerun
                return
            yield True
        finally:
            self.room.release(row)

    @contextlib.contextmanager
    def working(self, row: Row) -> Iterator[None]:
        """The line counts among those whose results may still give room back."""
        self.room.working += 1
        try:
            yield
        finally:
            self.room.working -= 1
            self.room.changed()  # a line waiting for room may stop waiting

    async def unsent(self, row: Row, err: ImggwError | None) -> None:
        """An admitted submit made nothing: the guard gives its place back; a refusal for want
        of credits ends the run's submits, any other counts as a failure."""
        await self.guard.release(row.identity)
        if isinstance(err, InsufficientCreditsError):  # the line waits for a top-up
            await self.guard.out_of_credits()
            await self.note_stop()
        elif err is not None:
            await self.guard.failed(err.code or "refused")

    async def note_stop(self) -> None:
        """A guard refused a submit, or the gateway one for want of credits: no more are tried
        in this run, and the guard's word on why is kept for the report."""
        self.run.stopped = True
        if not self.stop_noted:
            self.stop_noted = True
            state = await self.guard.state()
            self.run.stopped_by, self.run.stop_reason = state.stopped_by, state.why
            self.report()

    async def charged(self, row: Row, task: Task, *, final: bool) -> None:
        """What the line's task reports it cost, as soon as any answer states it: the run's
        money, the row, and the guard (a cap is kept by charges, not by guesses). While the
        task runs its charge never drops (``_spending.reported``)."""
        before = Charge(row.credits, row.cost).clamped()
        now = reported(before, Charge(task.credits, task.cost), final=final)
        if now != before and now.known:
            self.run.charged(before, now)
            row.credits, row.cost = now.credits, now.cost
            if not final:  # the line's state will not move yet: keep the charge now
                self.run.ledger.save(row)
        if row.made_here and (now != before or final):
            resolution = str(row.fields.get("resolution", ""))
            failed = task.status is TaskStatus.FAILED
            await self.guard.charged(
                row.identity, resolution, before, now, final=final, failed=failed
            )

    async def ended(self, row: Row, task: Task) -> None:
        """A failed task of the run's own counts for the failure guard."""
        if row.made_here and task.status is TaskStatus.FAILED:
            await self.guard.failed(task.error.code if task.error else "failed")

    async def saved(self, row: Row) -> None:
        """The gallery, rewritten now and then as lines are saved."""
        await self.gallery.maybe()
