"""Room on the disk for what a run pays for (``batch/_admission.py``): a submit waits until the
folder has room for every unsaved result and its own, and a run with nothing in flight to give
room back stops, saying how much it needs. The disk is a fake one (``free_bytes``)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from imggw_client.batch import _admission
from imggw_client.batch._admission import NO_ROOM, Room, room_of
from imggw_client.batch._schema import RUNNING, SAVED, SUCCEEDED, UNKNOWN

from .ledgers import planned, row

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
