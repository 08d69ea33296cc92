"""Room on the disk for what a run has paid for: no submit goes out without room in the folder
for the results of every line in flight and its own (``rules.RESULT_ROOM``, per resolution).
Short of room with nothing in flight that could give some back, the run stops submitting and
ends with a :class:`StorageError` (``NO_ROOM``) once what it sent is saved.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread

from .._core.rules import RESULT_ROOM
from .._core.states import State
from .._files import StorageError
from ._ledger import Ledger
from ._schema import Row
from ._states import RUNNING, SUCCEEDED

__all__ = ["NO_ROOM", "Room", "free_bytes", "room_of"]

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
    (``to_store``) and of lines whose submit is on its way (``reserved``). ``flying`` counts
    the lines not saved yet, for the message of a run that stops for want of room.
    """

    def __init__(self, folder: Path, flying: Callable[[], int]) -> None:
        self.folder = folder
        self.flying = flying
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
            self.to_store += _row_room(row) if state in _UNSAVED else -_row_room(row)
            self.changed()

    async def count_unsaved(self, ledger: Ledger) -> None:
        """The room the results of lines sent by earlier runs, and not saved yet, may need."""
        found = await anyio.to_thread.run_sync(ledger.unsaved_by_resolution)
        self.to_store += sum(room_of(resolution) * n for resolution, n in found.items())

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
        flying, mib = self.flying(), 1 << 20
        return StorageError(
            f"{self.folder} has {free / mib:.1f} MiB free; the results of the next line"
            + (f" and of the {flying} unsaved ones" if flying else "")
            + f" may need about {math.ceil(need / mib)} MiB: nothing more was sent (what was "
            "paid for is saved); make room, then run the same command to resume",
            code=NO_ROOM,
        )
