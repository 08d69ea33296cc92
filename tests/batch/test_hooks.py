"""The batch's hooks on the tracker's loop (``batch/_hooks.py``): a submit admitted only past the
room and the guards, a refusal for want of credits that stops the run's submits with the guard's
word, charges kept in the run's money and told to the guard, failures counted for the guards,
and tasks made elsewhere (``task_id`` lines) passing no guard."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from imggw_client import InsufficientCreditsError, Task, TaskStatus
from imggw_client.batch._admission import BatchHooks, Charge, LocalGuard, Room, Spending
from imggw_client.batch._lines import COLLECT
from imggw_client.batch._plan import Caps
from imggw_client.batch._schema import RUNNING
from imggw_client.batch._store import GalleryPace, RunLines

from .ledgers import planned, row

pytestmark = pytest.mark.anyio


class _Pace(GalleryPace):
    def __init__(self) -> None:
        self.calls = 0

    async def maybe(self) -> None:
        self.calls += 1


def _hooks(ledger: Any, tmp_path: Path, caps: Caps) -> tuple[RunLines, BatchHooks, LocalGuard]:
    room = Room(tmp_path)
    run = RunLines(ledger, ledger.totals(), room, deadline=math.inf, line_timeout=None, redact=str)
    guard = LocalGuard(Spending(caps))
    return run, BatchHooks(run, guard, room, _Pace()), guard


def _task(task_id: str, status: TaskStatus, credits: float | None = None) -> Task:
    return Task(id=task_id, surface="beta", status=status, credits=credits)


async def test_a_guard_that_says_no_stops_the_submits_and_gives_the_room_back(
    tmp_path: Path,
) -> None:
    with planned(tmp_path, [row(1), row(2)]) as ledger:
        run, hooks, _ = _hooks(ledger, tmp_path, Caps(max_failures=1))
        first, second = ledger.rows()
        async with hooks.admit(first) as admitted:
            assert admitted
            assert hooks.room.reserved > 0  # held while its submit goes
        assert hooks.room.reserved == 0
        await hooks.unsent(first, InsufficientCreditsError("empty", status_code=402))
        assert run.stopped
        assert run.stopped_by is not None  # the guard's word is kept for the report
        async with hooks.admit(second) as admitted:
            assert not admitted  # the run stopped: no room is asked, nothing is sent
        assert hooks.room.reserved == 0


async def test_charges_are_the_runs_money_and_a_failed_task_counts_for_the_guard(
    tmp_path: Path,
) -> None:
    with planned(tmp_path, [row(1, RUNNING, task_id="1")]) as ledger:
        run, hooks, guard = _hooks(ledger, tmp_path, Caps(max_failures=1))
        (line,) = ledger.rows()
        await hooks.charged(line, _task("1", TaskStatus.RUNNING, 4.0), final=False)
        assert (line.credits, run.credits) == (4.0, 4.0)
        failed = _task("1", TaskStatus.FAILED, 4.0)
        await hooks.charged(line, failed, final=True)
        await hooks.ended(line, failed)
        state = await guard.state()
        assert state.charged_total == Charge(4.0, None)
        assert not await guard.admit("line:9", "1k")  # one failure: the failure guard holds
        await hooks.saved(line)
        assert isinstance(hooks.gallery, _Pace)
        assert hooks.gallery.calls == 1  # the gallery's pace is told of each line saved


async def test_a_task_made_elsewhere_passes_no_guard(tmp_path: Path) -> None:
    collected = row(1, RUNNING, task_id="7", kind=COLLECT, idempotency_key=None)
    with planned(tmp_path, [collected]) as ledger:
        run, hooks, guard = _hooks(ledger, tmp_path, Caps(max_credits=1.0, max_failures=1))
        (line,) = ledger.rows()
        failed = _task("7", TaskStatus.FAILED, 9.0)
        await hooks.charged(line, failed, final=True)
        await hooks.ended(line, failed)
        assert run.credits == 9.0  # the run's money says what it cost ...
        assert not (await guard.state()).charged_total.positive  # ... the guards never see it
        assert await guard.admit("line:2", "1k")
