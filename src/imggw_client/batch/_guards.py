"""The guards a run asks before each submit (DESIGN 14): a :class:`Spending` (``_spending``, the
pure logic) held in this process (:class:`LocalGuard`) or elsewhere, on a Dask scheduler for
every shard of a run (``_dask_budget``), and asked through a :class:`RemoteGuard`. Both are
told each step as one message (:func:`handle` reads them where the spending is held), so that
the run (``_hooks``) sees one :class:`Guard`, wherever its spending lives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping

import anyio

from ._spending import Caps, Charge, Spending, Verdict

__all__ = ["Guard", "LocalGuard", "RemoteGuard", "charge_of", "handle"]

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
