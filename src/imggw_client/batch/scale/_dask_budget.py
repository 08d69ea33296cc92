"""What a whole Dask run shares, held on the scheduler (a scheduler outlives any worker): the
request budget (DESIGN 9, 10, 25; a pure ``Budget``, the same policy as every other: each
worker's client asks it for each request's slot and tells it how each ended, so a 429 seen by
any worker slows every worker) and the run's spend and failure guards (DESIGN 14; a pure
``Spending``: one count for every shard).

A slot belongs to the worker that asked for it: when the scheduler removes a worker (it died,
or was retired), its slots are given back at once, so a worker SIGKILLed mid-run never holds
the window of requests in flight for the others. A worker is never left to poll: the scheduler
holds its question until the slot comes (at most :data:`HOLD` seconds, so the worker's own
deadline still counts), woken by every answer that frees a place.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from distributed import get_worker
from distributed.diagnostics.plugin import SchedulerPlugin

from ..._core.budget import DEFAULT_BACKOFF, Budget, Ended, Ticket
from ..._core.config import RateLimit
from .._admission import RemoteGuard, Spending, charge_of, handle
from .._plan import Caps

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "GUARD_HANDLER",
    "HANDLER",
    "PLUGIN_NAME",
    "BudgetPlugin",
    "SchedulerBudget",
    "scheduler_guard",
]

PLUGIN_NAME = "imggw-budgets"
HANDLER = "imggw_budget"
GUARD_HANDLER = "imggw_guard"
# A slot neither used nor given back this long belonged to a worker the scheduler never saw
# leave (a worker removed gives its slots back at once: ``remove_worker``).
TICKET_TTL = 900.0
# The longest the scheduler holds a worker's question before it answers with the wait left: the
# worker's flows then check their deadline, and ask again (one question a second at most).
HOLD = 1.0


class BudgetPlugin(SchedulerPlugin):
    """Request budgets on the scheduler, one per run (by run id), asked by every worker through
    the scheduler handler ``imggw_budget``. The logic is the pure :class:`Budget`'s, on the
    scheduler's clock; tickets live here, so a worker only holds their numbers.
    """

    idempotent = True  # registering it again (another run) keeps the budgets it holds
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.guards: dict[str, Spending] = {}
        self.budgets: dict[str, Budget] = {}
        # Each ticket: its budget, its slot, when it was handed out, and the worker it is for.
        self.tickets: dict[int, tuple[str, Ticket, float, str | None]] = {}
        self.numbers = itertools.count(1)
        self.swept = 0.0

    async def start(self, scheduler: Any) -> None:
        scheduler.handlers[HANDLER] = self.serve
        scheduler.handlers[GUARD_HANDLER] = self.guard

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        """A worker left the cluster (dead or retired): the slots it held are given back."""
        for number, (budget, slot, _, holder) in list(self.tickets.items()):
            if holder == worker:
                del self.tickets[number]
                self.budgets[budget].release(slot)

    async def serve(self, **message: Any) -> dict[str, Any]:
        """The scheduler's handler: :meth:`handle`, but a question about a slot is held until
        the slot comes (or :data:`HOLD` passes), asleep until the budget wakes it
        (``Budget.arm``): never polled."""
        answer = self.handle(**message)
        until = time.monotonic() + HOLD
        number = answer.get("ticket", message.get("ticket"))
        while number in self.tickets and answer.get("wait"):
            left = until - time.monotonic()
            if answer["wait"] > left:
                break  # longer than a hold: the worker sleeps it, its deadline in view
            budget, slot, _, _ = self.tickets[number]
            woken = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):  # not TimeoutError before 3.11
                await asyncio.wait_for(
                    woken.wait(), min(self.budgets[budget].arm(slot, woken.set), left)
                )
            waited = self.handle(message["budget"], "wait", ticket=number)
            answer = {**answer, "wait": waited["wait"]}
        return answer

    def guard(self, run: str, action: str, **message: Any) -> dict[str, Any]:
        """The run's guards: opened by the driver (caps, what the folder's run was charged so
        far and the highest charge per resolution), then asked by every shard's engine."""
        if action == "open":
            caps, spent = message.get("caps") or [None, None, None], message.get("spent")
            prices = {
                str(res): charge_of(charge) for res, charge in (message.get("prices") or {}).items()
            }
            self.guards[run] = Spending(Caps(*caps), spent=charge_of(spent), prices=prices)
            return {"ok": True}
        return handle(self.guards.setdefault(run, Spending(Caps())), action, **message)

    def handle(
        self,
        budget: str,
        action: str,
        kind: str | None = None,
        ticket: int | None = None,
        limit: dict[str, float | None] | None = None,
        limited: bool = False,
        retry_after: float | None = None,
        backoff: tuple[float, float] | list[float] | None = None,
        worker: str | None = None,
    ) -> dict[str, Any]:
        """One question of a worker's client (``action``: open, reserve, wait, release,
        finished) about the run's budget ``budget``; ``worker`` is the asking worker's
        address."""
        now = time.monotonic()
        self._sweep(now)
        if action == "open":
            if budget not in self.budgets:
                rates = limit or {}
                self.budgets[budget] = Budget(
                    RateLimit(
                        submits_per_second=rates.get("submits_per_second"),
                        queries_per_second=rates.get("queries_per_second"),
                    )
                )
            return {"ok": True}
        held = self.budgets.setdefault(budget, Budget(RateLimit()))
        if action == "reserve":
            assert kind is not None
            new = held.reserve(kind, now)
            number = next(self.numbers)
            self.tickets[number] = (budget, new, now, worker)
            return {"ticket": number, "wait": held.wait_time(new, now)}
        found = self.tickets.get(ticket) if ticket is not None else None
        if found is None:  # swept, or the scheduler restarted: nothing to wait for
            return {"wait": 0.0}
        slot = found[1]
        if action == "wait":
            return {"wait": held.wait_time(slot, now)}
        del self.tickets[ticket]  # type: ignore[arg-type]
        if action == "release":
            held.release(slot)
        else:
            first, longest = backoff or DEFAULT_BACKOFF
            held.finished(
                slot, now, limited=limited, retry_after=retry_after, backoff=(first, longest)
            )
        return {"ok": True}

    def _sweep(self, now: float) -> None:
        if now - self.swept < 60.0:
            return
        self.swept = now
        for number, (budget, slot, since, _) in list(self.tickets.items()):
            if now - since > TICKET_TTL:
                del self.tickets[number]
                self.budgets[budget].release(slot)


class SchedulerBudget:
    """The budget a worker's client asks: the run's, on the scheduler (a ``BudgetService``)."""

    def __init__(self, budget: str) -> None:
        self.budget = budget
        worker = get_worker()
        self.scheduler = worker.scheduler  # pooled: its connections are kept between calls
        self.worker = worker.address  # the slots it holds are given back if it dies

    async def _ask(self, **message: Any) -> dict[str, Any]:
        answer: dict[str, Any] = await getattr(self.scheduler, HANDLER)(
            budget=self.budget, worker=self.worker, **message
        )
        return answer

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        answer = await self._ask(action="reserve", kind=kind)
        return answer["ticket"], float(answer["wait"])

    async def wait_time(self, ticket: Hashable) -> float:
        return float((await self._ask(action="wait", ticket=ticket))["wait"])

    async def release(self, ticket: Hashable) -> None:
        await self._ask(action="release", ticket=ticket)

    async def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        await self._ask(action="finished", ticket=ticket, **ended)


def scheduler_guard(run: str) -> RemoteGuard:
    """The guard a worker's engine asks: the run's, on the scheduler."""
    scheduler = get_worker().scheduler

    async def ask(**message: Any) -> dict[str, Any]:
        answer: dict[str, Any] = await getattr(scheduler, GUARD_HANDLER)(run=run, **message)
        return answer

    return RemoteGuard(ask)
