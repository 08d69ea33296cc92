"""The admission of a submit (``batch/_admission.py``): room on the disk for what a run pays for (a
submit waits until the folder has room for every unsaved result and its own, and a run with
nothing in flight to give room back stops, saying how much it needs; the disk is a fake one,
``free_bytes``), and the one hook on the tracker's loop: a submit admitted only past the room and
the guards, a refusal for want of credits that stops the run's submits with the guard's word,
charges kept in the run's money and told to the guard, failures counted for the guards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import InsufficientCreditsError, Task, TaskStatus
from imggw_client.batch import _admission
from imggw_client.batch._admission import (
    NO_ROOM,
    BatchHooks,
    Charge,
    LocalGuard,
    Room,
    Spending,
    room_of,
)
from imggw_client.batch._lines import COLLECT
from imggw_client.batch._plan import Caps
from imggw_client.batch._schema import RUNNING, SAVED, SUCCEEDED, UNKNOWN
from imggw_client.batch._store import GalleryPace, RunLines

from .ledgers import planned, row, run_lines

MiB = 1 << 20


def test_a_result_needs_room_by_its_resolution_and_an_unknown_one_the_most() -> None:
    assert room_of("1k") == 4 * MiB
    assert room_of("2K") == 16 * MiB
    assert room_of("4k") == 64 * MiB
    assert room_of("") == room_of("1k")  # a collected task's: not known, 1k's
    assert room_of("8k") == room_of("4k")


def test_lines_running_or_downloading_keep_their_room_until_saved() -> None:
    room = Room(Path("."))
    line = row(1, UNKNOWN, resolution="2k")
    room.moved(line, RUNNING)
    line.state = RUNNING
    assert room.to_store == 16 * MiB
    room.moved(line, SUCCEEDED)  # still unsaved: nothing changes
    line.state = SUCCEEDED
    assert room.to_store == 16 * MiB
    room.moved(line, SAVED)
    assert room.to_store == 0


@pytest.mark.anyio
async def test_a_submit_waits_for_room_given_back_then_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_admission, "free_bytes", lambda folder: 10 * MiB)
    room = Room(Path("."))
    first, second = row(1), row(2)
    assert await room.reserve(first, stopped=lambda: False)
    assert room.reserved == 4 * MiB
    room.release(first)  # sent: now it counts as a result to store
    room.moved(first, RUNNING)
    first.state = RUNNING
    room.working = 1
    assert await room.reserve(second, stopped=lambda: False)  # 4 + 4 <= 10
    room.release(second)
    room.moved(second, RUNNING)
    second.state = RUNNING
    third = row(3)
    went = anyio.Event()

    async def submit_third() -> None:
        assert await room.reserve(third, stopped=lambda: False)
        went.set()

    async with anyio.create_task_group() as group:
        group.start_soon(submit_third)
        await anyio.wait_all_tasks_blocked()
        assert not went.is_set()  # 4 + 4 + 4 > 10: it waits
        room.moved(first, SAVED)  # the first result is saved: its room is free again
        await went.wait()
    assert room.no_room is None
    assert room.reserved == 4 * MiB


@pytest.mark.anyio
async def test_with_nothing_in_flight_a_run_short_of_room_stops_saying_what_it_needs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_admission, "free_bytes", lambda folder: 3 * MiB)
    room = Room(tmp_path)
    with planned(
        tmp_path,
        [row(1, RUNNING, task_id="1"), row(2, SUCCEEDED, task_id="2"), row(3, SAVED, task_id="3")],
    ) as ledger:
        await room.count_unsaved(ledger)
    assert room.to_store == 8 * MiB  # the two results still to save
    assert not await room.reserve(row(4), stopped=lambda: False)
    assert room.no_room is not None
    assert room.no_room.code == NO_ROOM
    assert room.no_room.message == (
        f"{tmp_path} has 3.0 MiB free; the results of the next line and of the 2 unsaved ones "
        "may need about 12 MiB: nothing more was sent (what was paid for is saved); make "
        "room, then run the same command to resume"
    )
    assert not await room.reserve(row(5), stopped=lambda: False)  # no second look


@pytest.mark.anyio
async def test_a_disk_that_cannot_tell_its_room_lets_every_line_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_admission, "free_bytes", lambda folder: None)
    room = Room(Path("."))
    assert await room.reserve(row(1, resolution="4k"), stopped=lambda: False)
    assert not await room.reserve(row(2), stopped=lambda: True)  # the run stopped submitting


class _Pace(GalleryPace):
    def __init__(self) -> None:
        self.calls = 0

    async def maybe(self) -> None:
        self.calls += 1


def _hooks(ledger: Any, tmp_path: Path, caps: Caps) -> tuple[RunLines, BatchHooks, LocalGuard]:
    room = Room(tmp_path)
    run = run_lines(ledger, room=room)  # the hooks move lines through the same room
    guard = LocalGuard(Spending(caps))
    return run, BatchHooks(run, guard, room, _Pace()), guard


def _task(task_id: str, status: TaskStatus, credits: float | None = None) -> Task:
    return Task(id=task_id, surface="beta", status=status, credits=credits)


@pytest.mark.anyio
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


@pytest.mark.anyio
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


@pytest.mark.anyio
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
