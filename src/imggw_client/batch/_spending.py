"""Spend and failure guards (DESIGN 14): a batch never spends more than its owner allows, and
stops submitting when its lines keep failing. A guard stops new submits only: lines already
sent are waited on and their results saved.

:class:`Spending` is the pure logic, one per run: the charges seen so far, the lines sent whose
charge is not known yet (each counted at an estimate), the highest charge seen per resolution.
Before a line is submitted, what was charged, plus an estimate for every line in flight, plus
one for this line, must stay within each cap; while nothing has been charged yet, one line goes
alone and the others wait for its charge. The first line of each resolution no price was seen
for goes alone too, estimated at the most that resolution could cost (the prices seen, scaled by
its pixels: 4x a 1k price for 2k, 16x for 4k), and only when the cap's room covers that.

What a gateway states while a task runs is not its price: many providers state 0 until a job
ends. Only a final charge, or a positive one, is learned as a price or releases a line's
estimate (:func:`settles`); a charge never counts below 0, nor below what the line's task
stated before while it runs (:func:`reported`). So with fixed prices per resolution a run so
guarded never spends past its cap, whatever its gateway states while tasks run, and stops short
of it by less than one task's worst-case price. The one exception is the very first line of a
run that knows no price at all: it goes alone, since nothing else can tell what a task costs,
and a cap smaller than that one task's price is passed by it (then the run stops).

:class:`Spending` is held for a run by a guard (``_guards``): in this process, or on a Dask
scheduler for every shard of a run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

from .._core import reasons
from .._core.rules import PIXELS

__all__ = [
    "GUARDS",
    "INSUFFICIENT_CREDITS",
    "MAX_COST",
    "MAX_CREDITS",
    "MAX_FAILURES",
    "Caps",
    "Charge",
    "Spending",
    "Verdict",
    "reported",
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


@dataclass(frozen=True)
class Caps:
    """The limits of a run: spend caps (None: none) and the most failed lines."""

    max_credits: float | None = None
    max_cost: float | None = None
    max_failures: int | None = None

    @property
    def spend(self) -> bool:
        return self.max_credits is not None or self.max_cost is not None


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
        if not self.prices:  # nothing charged yet: one line at a time finds the price
            return self._go(line, resolution) if not self._flying else Verdict.WAIT
        if resolution not in self.prices and self._per_resolution.get(resolution):
            # A resolution no price was seen for yet: its first line goes alone, at the most it
            # could cost, until its own price is known.
            return Verdict.WAIT
        for cap, spent, unit in (
            (MAX_CREDITS, self._credits, "credits"),
            (MAX_COST, self._cost, "cost"),
        ):
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
