"""Admission: what a run asks before each submit, and tells as lines are charged and fail.

Spend and failure guards (DESIGN 14): a batch never spends more than its owner allows, and
stops submitting when its lines keep failing. A guard stops new submits only: lines already
sent are waited on and their results saved. :class:`Spending` is the pure logic, one per run:
the charges seen so far, the lines sent whose charge is not known yet (each counted at an
estimate), the highest charge seen per resolution. Before a line is submitted, what was
charged, plus an estimate for every line in flight, plus one for this line, must stay within
each cap; while nothing has been charged yet, one line goes alone and the others wait for its
charge. The first line of each resolution no price was seen for goes alone too, estimated at
the most that resolution could cost (the prices seen, scaled by its pixels: 4x a 1k price for
2k, 16x for 4k), and only when the cap's room covers that.

What a gateway states while a task runs is not its price: many providers state 0 until a job
ends. Only a final charge, or a positive one, is learned as a price or releases a line's
estimate (:func:`settles`); a charge never counts below 0, nor below what the line's task
stated before while it runs (:func:`reported`). So with fixed prices per resolution a run so
guarded never spends past its cap, whatever its gateway states while tasks run, and stops short
of it by less than one task's worst-case price. The one exception is the very first line of a
run that knows no price at all: it goes alone, since nothing else can tell what a task costs,
and a cap smaller than that one task's price is passed by it (then the run stops).

A :class:`Spending` is held for a run by a :class:`Guard`: in this process
(:class:`LocalGuard`), or on a Dask scheduler for every shard of a run (``scale/_dask_budget``),
asked through a :class:`RemoteGuard`; each step travels as one message (:func:`handle` reads
them where the spending is held).

Room on the disk for what a run has paid for (:class:`Room`): no submit goes out without room
in the folder for the results of every line in flight and its own (``rules.RESULT_ROOM``, per
resolution). Short of room with nothing in flight that could give some back, the run stops
submitting and ends with a :class:`StorageError` (``NO_ROOM``) once what it sent is saved.

The one admission hook on the tracker's loop (``tracking/_store.Hooks``) is
:class:`BatchHooks`: no submit goes out without room and the guards' yes, nor after the gateway
refused one for want of credits; every charge a task states is the run's money, the row's and
the guard's; a failed task counts for the guards; a saved line may rewrite the gallery;
progress is told when a guard or the disk stops the submits. Lines with a ``task_id`` (tasks
made elsewhere) pass no guard: collecting bills nothing.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread

from .._core import reasons
from .._core.exceptions import ImggwError, InsufficientCreditsError
from .._core.models import Task, TaskStatus
from .._core.rules import PIXELS, RESULT_ROOM
from .._core.states import State
from .._files import StorageError
from ._ledger import Ledger
from ._plan import Caps
from ._schema import RUNNING, SUCCEEDED, Row
from ._store import RunLines

__all__ = [
    "BatchHooks",
    "Charge",
    "GUARDS",
    "Guard",
    "INSUFFICIENT_CREDITS",
    "LocalGuard",
    "MAX_COST",
    "MAX_CREDITS",
    "MAX_FAILURES",
    "NO_ROOM",
    "RemoteGuard",
    "Room",
    "Spending",
    "Verdict",
    "charge_of",
    "free_bytes",
    "handle",
    "reported",
    "room_of",
    "settles",
]


# The guards that may stop a run (``report.stopped_by``), pinned by DESIGN 14; the last is the
# gateway's own reason for refusing a submit it cannot bill.
MAX_CREDITS, MAX_COST, MAX_FAILURES = "max_credits", "max_cost", "max_failures"
INSUFFICIENT_CREDITS = reasons.INSUFFICIENT_CREDITS.code
GUARDS = (MAX_CREDITS, MAX_COST, MAX_FAILURES, INSUFFICIENT_CREDITS)


@dataclass(frozen=True)
class Charge:
    """What a task cost, as the gateway reports it: credits and cost (None: not stated)."""

    credits: float | None = None
    cost: float | None = None

    @property
    def known(self) -> bool:
        return self.credits is not None or self.cost is not None

    @property
    def positive(self) -> bool:
        """Stated, and every unit it states above 0."""
        stated = [v for v in (self.credits, self.cost) if v is not None]
        return bool(stated) and all(v > 0 for v in stated)

    def highest(self, other: Charge) -> Charge:
        """Unit by unit, the higher of two charges (a unit neither states stays None)."""
        return Charge(_most(self.credits, other.credits), _most(self.cost, other.cost))

    def clamped(self) -> Charge:
        """Each unit a finite number >= 0 (a negative one 0), or None (NaN, infinity)."""
        return Charge(_clamp(self.credits), _clamp(self.cost))


def reported(before: Charge, now: Charge, *, final: bool) -> Charge:
    """What a line's charge counts as, given what its row kept (``before``) and what its task
    states ``now``: clamped, and while the task runs never below what it stated before (a
    running task's charge that drops would hand back room under the cap it still takes). A
    final charge is the task's own word, a refund included.
    """
    now = now.clamped()
    return now if final else now.highest(before.clamped())


def settles(charge: Charge, *, final: bool) -> bool:
    """Whether ``charge`` is what a line costs, so that its estimate is given back: a final
    charge, or a positive one (a running task stating 0 has not said its price yet).
    """
    return charge.known and (final or charge.positive)


class Verdict(str, Enum):
    GO = "go"  # submit it
    WAIT = "wait"  # ask again once a charge is known or a line is given back
    STOP = "stop"  # a guard stopped the run: leave the line for a rerun


@dataclass
class Spending:
    """The pure guard of one run (see the module's docstring). ``spent`` is what the run's lines
    were charged before this invocation; ``prices`` the highest charge seen per resolution.
    Every method is O(1) in the run's size: lines in flight are counted per resolution.
    """

    caps: Caps
    spent: Charge = field(default_factory=Charge)
    prices: dict[str, Charge] = field(default_factory=dict)
    stopped_by: str | None = None
    failures: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    why: str = ""
    _flying: dict[Hashable, str] = field(default_factory=dict)  # line -> resolution
    _per_resolution: Counter[str] = field(default_factory=Counter)
    _armed: str | None = None  # a guard whose limit was reached; it stops the next submit
    _credits: float = 0.0
    _cost: float = 0.0

    def __post_init__(self) -> None:
        spent = self.spent.clamped()
        self._credits = spent.credits or 0.0
        self._cost = spent.cost or 0.0
        clamped = {res: p.clamped() for res, p in self.prices.items()}
        self.prices = {res: p for res, p in clamped.items() if p.known}

    # ------------------------------------------------------------------------ asking

    def admit(self, line: Hashable, resolution: str) -> Verdict:
        """Whether ``line`` (of ``resolution``) may be submitted now. GO counts it in flight
        until its charge is known (:meth:`charged`) or it is given back (:meth:`release`)."""
        if self.stopped_by is not None:
            return Verdict.STOP
        if self._armed is not None:
            self.stopped_by = self._armed
            return Verdict.STOP
        if not self.caps.spend:
            return self._go(line, resolution)
        spending = ((MAX_CREDITS, self._credits, "credits"), (MAX_COST, self._cost, "cost"))
        for cap, spent, unit in spending:
            limit = getattr(self.caps, cap)
            if limit is not None and spent >= limit:  # spent already: whatever a line costs
                return self._stop(cap, f"{_amount(spent)} of {_amount(limit)} {unit} spent")
        if not self.prices:  # nothing charged yet: one line at a time finds the price
            return self._go(line, resolution) if not self._flying else Verdict.WAIT
        if resolution not in self.prices and self._per_resolution.get(resolution):
            # A resolution no price was seen for yet: its first line goes alone, at the most it
            # could cost, until its own price is known.
            return Verdict.WAIT
        for cap, spent, unit in spending:
            limit = getattr(self.caps, cap)
            if limit is None:
                continue
            price = self._estimate(resolution, unit)
            if price is None:  # the gateway states no such charge: it cannot be kept to
                return self._stop(cap, f"the gateway reports no {unit} for its tasks")
            flying = sum(
                (self._estimate(r, unit) or 0.0) * n for r, n in self._per_resolution.items()
            )
            if spent + flying + price > limit * (1 + 1e-9):
                if self._flying:  # a line in flight may yet be given back
                    return Verdict.WAIT
                return self._stop(cap, f"{_amount(spent)} of {_amount(limit)} {unit} spent")
        return self._go(line, resolution)

    def estimate(self, resolution: str) -> Charge | None:
        """What a line of ``resolution`` is expected to cost: the highest charge seen for its
        resolution, else the most it could cost from the prices seen for others (each scaled up
        by the ratio of pixels: 4x a 1k price for 2k, 16x for 4k; a smaller resolution at most
        a larger one's price); None before any price is known."""
        if not self.prices:
            return None
        return Charge(self._estimate(resolution, "credits"), self._estimate(resolution, "cost"))

    def _estimate(self, resolution: str, unit: str) -> float | None:
        seen = self.prices.get(resolution)
        value = getattr(seen, unit) if seen is not None else None
        if value is None:
            pixels = _pixels(resolution, unknown=max(PIXELS.values()))
            worst = [
                v * max(1.0, pixels / _pixels(res, unknown=1))
                for res, price in self.prices.items()
                if (v := getattr(price, unit)) is not None
            ]
            value = max(worst, default=None)
        return value

    def flying(self, line: Hashable, resolution: str) -> None:
        """``line`` was sent before this invocation and its charge is not known yet: it counts
        in flight, as if this invocation had let it go."""
        self._go(line, resolution)

    def _go(self, line: Hashable, resolution: str) -> Verdict:
        if line not in self._flying:
            self._flying[line] = resolution
            self._per_resolution[resolution] += 1
        return Verdict.GO

    def _stop(self, guard: str, why: str) -> Verdict:
        self.stopped_by, self.why = guard, why
        return Verdict.STOP

    # ------------------------------------------------------------------------ telling

    def charged(
        self,
        line: Hashable,
        resolution: str,
        before: Charge,
        now: Charge,
        *,
        final: bool,
        failed: bool = False,
    ) -> None:
        """The charge of ``line`` is now ``now`` (it was ``before``, as its row kept it).
        ``final``: the task ended, and a charge it still does not state never will be;
        ``failed``: it ended failed (what a failed task is charged, 0 often, is no price).
        Only a final or a positive charge gives the line's estimate back (:func:`settles`)."""
        before = before.clamped()
        now = reported(before, now, final=final)
        if now.known:
            self._credits += (now.credits or 0.0) - (before.credits or 0.0)
            self._cost += (now.cost or 0.0) - (before.cost or 0.0)
        if settles(now, final=final):
            self.release(line)
            if now.positive or not failed:
                self.prices[resolution] = self.prices.get(resolution, Charge()).highest(now)
        elif final:  # a task that ended and states no charge: a cap cannot be kept
            self.release(line)
            if self.caps.spend and self._armed is None:
                self._armed = MAX_CREDITS if self.caps.max_credits is not None else MAX_COST
                self.why = "the gateway reports no charge for its tasks"

    def release(self, line: Hashable) -> None:
        """``line`` will not be charged (its submit was refused), or its charge is known."""
        resolution = self._flying.pop(line, None)
        if resolution is not None:
            self._per_resolution[resolution] -= 1
            if not self._per_resolution[resolution]:
                del self._per_resolution[resolution]

    def failed(self, code: str) -> None:
        """A line failed in this invocation (its task failed, or its submit was refused)."""
        self.failures += 1
        self.codes[code] += 1
        limit = self.caps.max_failures
        if limit is not None and self.failures >= limit and self._armed is None:
            self._armed = MAX_FAILURES
            common, times = self.codes.most_common(1)[0]
            self.why = f"{self.failures} lines failed; the most frequent error: {common} ({times})"

    def out_of_credits(self) -> None:
        """A submit was refused for want of credits (402): no more submits."""
        if self.stopped_by is None:
            self._stop(INSUFFICIENT_CREDITS, "the gateway says the account's credits ran out")

    @property
    def charged_total(self) -> Charge:
        """What the run's lines were charged in all (credits; cost, None when never stated)."""
        seen_cost = self.spent.cost is not None or any(
            p.cost is not None for p in self.prices.values()
        )
        return Charge(self._credits, self._cost if seen_cost else None)


def _most(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _clamp(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return max(0.0, value)


def _pixels(resolution: str, *, unknown: int) -> int:
    return PIXELS.get(resolution.lower(), unknown)


def _amount(value: float) -> str:
    return f"{value:g}" if math.isfinite(value) else str(value)


WAIT_POLL = 0.2  # seconds between a remote guard's answers "wait" and the next question


class Guard:
    """What a run asks before each submit, and tells as lines are charged and fail. What
    it tells travels as one message a step (see :func:`handle`); a guard says how a message
    reaches its :class:`Spending` (:meth:`tell`) and how a line waits to be admitted.
    """

    async def tell(self, action: str, **message: object) -> Mapping[str, object]:
        """One step told to the spending (the actions of :func:`handle`); its answer."""
        raise NotImplementedError

    async def admit(self, line: Hashable, resolution: str) -> bool:
        """Waits until ``line`` may be submitted (True), or a guard stopped the run (False)."""
        raise NotImplementedError

    async def state(self) -> Spending:
        """The guard's state as it stands (a copy when held elsewhere)."""
        raise NotImplementedError

    async def charged(
        self,
        line: Hashable,
        resolution: str,
        before: Charge,
        now: Charge,
        *,
        final: bool,
        failed: bool = False,
    ) -> None:
        """The charge of ``line`` is now ``now`` (see :meth:`Spending.charged`)."""
        await self.tell(
            "charged",
            line=line,
            resolution=resolution,
            before=[before.credits, before.cost],
            now=[now.credits, now.cost],
            final=final,
            failed=failed,
        )

    async def flying(self, line: Hashable, resolution: str) -> None:
        """``line`` was sent by an earlier run and its charge is not known yet."""
        await self.tell("flying", line=line, resolution=resolution)

    async def release(self, line: Hashable) -> None:
        """``line`` will not be charged (its submit was refused or not sent)."""
        await self.tell("release", line=line)

    async def failed(self, code: str) -> None:
        """A line failed in this run, with ``code``."""
        await self.tell("failed", code=code)

    async def out_of_credits(self) -> None:
        """The gateway refused a submit for want of credits: no more submits."""
        await self.tell("out_of_credits")


class LocalGuard(Guard):
    """A :class:`Spending` in this process: waiting lines wake when a charge comes in or a
    line is given back.
    """

    def __init__(self, spending: Spending) -> None:
        self.spending = spending
        self._changed = anyio.Event()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def tell(self, action: str, **message: object) -> Mapping[str, object]:
        answer = handle(self.spending, action, **message)
        self._wake()  # lines waiting to be admitted ask again
        return answer

    async def admit(self, line: Hashable, resolution: str) -> bool:
        while True:
            verdict = self.spending.admit(line, resolution)
            if verdict is not Verdict.WAIT:
                if verdict is Verdict.STOP:
                    self._wake()  # the others waiting learn it at once
                return verdict is Verdict.GO
            await self._changed.wait()

    async def state(self) -> Spending:
        return self.spending


Ask = Callable[..., Awaitable[Mapping[str, object]]]


class RemoteGuard(Guard):
    """A guard held elsewhere (a Dask scheduler: one for every shard of a run), asked through
    ``ask(action=..., ...)``; a line told to wait asks again every :data:`WAIT_POLL` seconds.
    """

    def __init__(self, ask: Ask) -> None:
        self.ask = ask

    async def tell(self, action: str, **message: object) -> Mapping[str, object]:
        return await self.ask(action=action, **message)

    async def admit(self, line: Hashable, resolution: str) -> bool:
        while True:
            answer = await self.ask(action="admit", line=line, resolution=resolution)
            verdict = Verdict(str(answer["verdict"]))
            if verdict is not Verdict.WAIT:
                return verdict is Verdict.GO
            await anyio.sleep(WAIT_POLL)

    async def state(self) -> Spending:
        answer = await self.ask(action="state")
        spending = Spending(Caps())
        spending.stopped_by = answer.get("stopped_by")  # type: ignore[assignment]
        spending.why = str(answer.get("why") or "")
        return spending


def handle(spending: Spending, action: str, **message: object) -> dict[str, object]:
    """One question to a guard held for others (the scheduler's handler calls this)."""
    line = message.get("line")
    resolution = str(message.get("resolution", ""))
    if action == "admit":
        return {"verdict": spending.admit(line, resolution).value}
    if action == "charged":
        before, now = message["before"], message["now"]
        spending.charged(
            line,
            resolution,
            charge_of(before),
            charge_of(now),
            final=bool(message.get("final")),
            failed=bool(message.get("failed")),
        )
    elif action == "flying":
        spending.flying(line, resolution)
    elif action == "release":
        spending.release(line)
    elif action == "failed":
        spending.failed(str(message.get("code")))
    elif action == "out_of_credits":
        spending.out_of_credits()
    elif action == "state":
        return {"stopped_by": spending.stopped_by, "why": spending.why}
    return {"ok": True}


def charge_of(value: object) -> Charge:
    """A charge as it travels (``[credits, cost]``), clamped; anything else is no charge."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        credits, cost = value
        return Charge(_number(credits), _number(cost)).clamped()
    return Charge()


def _number(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None  # type: ignore[arg-type]


NO_ROOM = "no_room"  # StorageError.code: the folder has no room for the next line's result
_UNSAVED = (RUNNING, SUCCEEDED)  # lines whose results are still to be saved


def free_bytes(folder: Path) -> int | None:
    """The bytes free to this user on ``folder``'s filesystem; None when it cannot tell (then
    the download still checks every write). :class:`Room` asks it before each submit, by this
    name, so that a test may put a fake disk in its place.
    """
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def room_of(resolution: str) -> int:
    """The room a result of ``resolution`` may need (``rules.RESULT_ROOM``; a collected task,
    whose resolution is not known, 1k's: a result that does not fit costs it nothing).
    """
    return RESULT_ROOM.get(resolution.lower() or "1k", max(RESULT_ROOM.values()))


def _row_room(row: Row) -> int:
    return room_of(str(row.fields.get("resolution") or ""))


class Room:
    """The room a run's results may need in ``folder``: of lines running or downloading
    (``to_store``) and of lines whose submit is on its way (``reserved``); ``unsaved`` counts
    the lines whose results are not saved yet, for the message of a run that stops for want of
    room.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.unsaved = 0  # lines running or downloading
        self.to_store = 0  # bytes the results of lines running or downloading may need
        self.reserved = 0  # ... and of lines whose submit is on its way
        self.working = 0  # lines of this run between their submit and their end in this run
        self.no_room: StorageError | None = None  # why the run stopped submitting, if for room
        self._lock = anyio.Lock()
        self._changed = anyio.Event()

    def changed(self) -> None:
        """Room may have been given back: a line waiting for room looks again."""
        self._changed.set()

    def moved(self, row: Row, state: State) -> None:
        """``row`` moves to ``state``: its result counts in ``to_store`` while unsaved."""
        if (row.state in _UNSAVED) != (state in _UNSAVED):
            self.unsaved += 1 if state in _UNSAVED else -1
            self.to_store += _row_room(row) if state in _UNSAVED else -_row_room(row)
            self.changed()

    async def count_unsaved(self, ledger: Ledger) -> None:
        """The room the results of lines sent by earlier runs, and not saved yet, may need."""
        found = await anyio.to_thread.run_sync(ledger.unsaved_by_resolution)
        self.to_store += sum(room_of(resolution) * n for resolution, n in found.items())
        self.unsaved += sum(found.values())

    async def reserve(self, row: Row, *, stopped: Callable[[], bool]) -> bool:
        """Waits until the folder has room for the results of every line in flight and this
        one's, and holds this one's (``reserved``, until :meth:`release`); False when the run
        stopped submitting meanwhile, or lacks that room with nothing in flight that could give
        some back (then :attr:`no_room` says so). One line asks at a time, in the order they
        came."""
        room = _row_room(row)
        async with self._lock:
            while not stopped() and self.no_room is None:
                self._changed = anyio.Event()
                free = free_bytes(self.folder)  # looked up now: a test's fake disk
                need = self.to_store + self.reserved + room
                if free is None or free >= need:
                    self.reserved += room
                    return True
                if not (self.working or self.reserved):  # nothing would give room back
                    self.no_room = self._refusal(free, need)
                    break
                await self._changed.wait()
        return False

    def release(self, row: Row) -> None:
        """The room ``row`` held while its submit went: a line sent counts in ``to_store``."""
        self.reserved -= _row_room(row)
        self.changed()

    def _refusal(self, free: int, need: int) -> StorageError:
        flying, mib = self.unsaved, 1 << 20
        return StorageError(
            f"{self.folder} has {free / mib:.1f} MiB free; the results of the next line"
            + (f" and of the {flying} unsaved ones" if flying else "")
            + f" may need about {math.ceil(need / mib)} MiB: nothing more was sent (what was "
            "paid for is saved); make room, then run the same command to resume",
            code=NO_ROOM,
        )


class Pace(Protocol):
    """The gallery, rewritten now and then as lines are saved (``GalleryPace``)."""

    async def maybe(self) -> None: ...


class BatchHooks:
    """The guard, room, money and gallery of one run (see the module's docstring); progress is
    told through the run's lines."""

    def __init__(self, run: RunLines, guard: Guard, room: Room, gallery: Pace) -> None:
        self.run = run
        self.guard = guard
        self.room = room
        self.gallery = gallery
        self.stop_noted = False

    def report(self) -> None:
        """Progress told at once (a display says so now, not at the next line)."""
        self.run.tell(True)

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
        task runs its charge never drops (:func:`reported`)."""
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
