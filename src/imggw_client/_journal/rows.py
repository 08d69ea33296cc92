"""A journal row read back: the :class:`JournalEntry` it becomes, or why it cannot be one
(:class:`DamagedRow`). Every value of a row is checked before it becomes an entry (a time, a
price, a task id that names files, text that reaches a log line): a file another program wrote,
a disk that flipped a byte, or a newer imggw's state must cost that row alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any

from .._core import rules, states
from .._core.models import ImageRequest, TaskStatus
from .._core.states import State
from .._core.text import printable

__all__ = ["COLUMNS", "DamagedRow", "JournalEntry", "RowDamaged", "entry_of"]

KEY_SHOWN = 80  # characters of a damaged row's key a message shows at most


def _asked(name: str) -> str:
    """A request field as a read selects it: a ledger's row keeps its request in ``fields``."""
    return (
        f"CASE WHEN json_valid(fields) THEN COALESCE(json_extract(fields, '$.{name}'), {name}) "
        f"ELSE {name} END"
    )


# What a read selects, in the order entry_of takes them.
# A ledger's row was made when its line was planned: its first send is when it was created as
# a journal's row is (a journal keeps no ``first_sent``).
COLUMNS = (
    "row, surface, idempotency_key, task_id, state, "
    f"{_asked('prompt')}, {_asked('aspect_ratio')}, {_asked('resolution')}, "
    "COALESCE(first_sent, created), submitted_at, expires_at, charge, files, gateway"
)


@dataclass(frozen=True)
class JournalEntry:
    """One journaled task.

    ``task_id`` is None while the submit's outcome is unknown; ``status`` is the task's
    :class:`TaskStatus` value (``"succeeded"`` for a saved or expired one too), or
    ``"unknown"``, or ``"not_found"`` (the gateway no longer knows the task); ``state`` says
    more (``saved``, ``expired``). Times are UTC datetimes (or None); ``files`` where its
    results were saved, as recorded (paths, or what ``mark_saved`` was given); ``request``
    what was asked; ``created_at`` when its first submit was about to leave.

    Example::

        for entry in journal.tasks(unfinished=True):
            print(entry.task_id, entry.status, entry.expires_at)
    """

    task_id: str | None
    surface: str
    idempotency_key: str
    status: str
    submitted_at: datetime | None
    expires_at: datetime | None
    files: tuple[str, ...]
    request: ImageRequest
    state: str = State.UNKNOWN.value
    charge: float | None = None
    gateway: str = ""
    created_at: datetime | None = field(default=None, repr=False)

    @property
    def unfinished(self) -> bool:
        """Whether the task still needs something: a resend, a wait or a download."""
        return states.WORK.get(State(self.state)) is not None

    def as_json(self) -> dict[str, Any]:
        """The entry as plain JSON values (``imggw tasks --json`` prints one per line)."""
        return {
            "task_id": self.task_id,
            "surface": self.surface,
            "idempotency_key": self.idempotency_key,
            "status": self.status,
            "state": self.state,
            "submitted_at": _iso(self.submitted_at),
            "expires_at": _iso(self.expires_at),
            "files": list(self.files),
            "request": {
                "prompt": self.request.prompt,
                "aspect_ratio": self.request.aspect_ratio,
                "resolution": self.request.resolution,
            },
            "charge": self.charge,
            "gateway": self.gateway,
        }


@dataclass(frozen=True)
class DamagedRow:
    """A journal row that cannot be read: its idempotency key (made printable, cut short), its
    row number in the file, and what is wrong with it. Every other row is read as usual.

    Example::

        for bad in journal.damaged():
            print(bad.row, bad.idempotency_key, bad.reason)
    """

    idempotency_key: str
    row: int
    reason: str


class RowDamaged(Exception):
    """A row that cannot become an entry; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def damaged_row(values: Sequence[Any], reason: str) -> DamagedRow:
    """What is shown of a damaged row: its key as printable text, bounded."""
    return DamagedRow(shown_key(values[2]), values[0], reason)


def shown_key(key: object) -> str:
    """A stored idempotency key as a message may show it: printable, at most KEY_SHOWN."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "backslashreplace")
    return printable(key if isinstance(key, str) else repr(key), KEY_SHOWN)


def entry_of(values: Sequence[Any], base: Path | None = None) -> JournalEntry:
    """The entry of a row read with :data:`COLUMNS`; :class:`RowDamaged` if any value is not
    what the journal writes. ``base``: a ledger's folder, where its rows' file names are (a
    ledger's row of a task collected by id has no key: ``""``)."""
    (
        _,
        surface,
        key,
        task_id,
        state,
        prompt,
        ratio,
        resolution,
        created,
        submitted,
        expires,
        charge,
        files,
        gateway,
    ) = values
    if surface not in rules.SURFACES:
        raise RowDamaged("unknown surface")
    if key is None and base is not None and task_id is not None:
        key = ""  # a task made elsewhere, collected by its id
    elif not _text(key) or rules.check_idempotency_key(key):
        raise RowDamaged("bad idempotency key")
    if task_id is not None and (not _text(task_id) or rules.check_task_id(task_id)):
        raise RowDamaged("bad task id")
    try:
        known = State(state)
    except ValueError:
        raise RowDamaged("unknown state") from None
    if (task_id is None) != (known is State.UNKNOWN):
        raise RowDamaged("a task id and a state that do not go together")
    if not all(_text(value) for value in (prompt, ratio, resolution, gateway)):
        raise RowDamaged("request fields that are not text")
    if charge is not None and not (_number(charge) and charge >= 0):
        raise RowDamaged("bad charge")
    return JournalEntry(
        task_id=task_id,
        surface=surface,
        idempotency_key=key,
        status=_status(known),
        submitted_at=_when(submitted, "submitted_at"),
        expires_at=_when(expires, "expires_at"),
        files=_files(files, base),
        request=ImageRequest.unchecked(prompt, ratio, resolution),
        state=known.value,
        charge=None if charge is None else float(charge),
        gateway=gateway,
        created_at=_when(created, "created") or _absent("created"),
    )


def _text(value: object) -> bool:
    """Text as the journal writes it: a string that was valid UTF-8 (the reading connection
    turns bytes that are not into lone surrogates, which no written text holds)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _when(epoch: object, name: str) -> datetime | None:
    if epoch is None:
        return None
    if not _number(epoch):
        raise RowDamaged(f"{name} is not a time")
    try:
        return datetime.fromtimestamp(epoch, tz=timezone.utc)  # type: ignore[arg-type]
    except (OverflowError, OSError, ValueError):
        raise RowDamaged(f"{name} is out of range") from None


def _absent(name: str) -> datetime:
    raise RowDamaged(f"{name} is missing")


def _files(stored: object, base: Path | None) -> tuple[str, ...]:
    """A journal's paths; a ledger's files (each its name, size and digest) as paths in its
    folder ``base``."""
    if not _text(stored):
        raise RowDamaged("files is not text")
    try:
        files = json.loads(stored)  # type: ignore[arg-type]
    except (ValueError, RecursionError):  # nested past Python's depth: no list of paths either
        raise RowDamaged("files is not JSON") from None
    if base is not None and isinstance(files, list):
        files = [f.get("path") if isinstance(f, dict) else None for f in files]
        if not all(_text(f) and _inside(f) for f in files):
            raise RowDamaged("files is not a list of names in the folder")
        files = [str(base / f) for f in files]
    if not isinstance(files, list) or not all(_path(f) for f in files):
        raise RowDamaged("files is not a list of paths")
    return tuple(files)


def _path(value: object) -> bool:
    """A path as this system names it: text, where bytes that are not UTF-8 (a folder named
    in Latin-1) are the surrogate escapes Python reads them as, so the path opens again."""
    if not isinstance(value, str) or "\0" in value:
        return False
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def _inside(name: str) -> bool:
    """Whether a ledger's file name stays in its folder (a row is someone else's bytes)."""
    path = PurePath(name)
    named = bool(path.parts) and not path.is_absolute() and ".." not in path.parts
    return named and "\\" not in name and "\x00" not in name


def _status(state: State) -> str:
    """The status word of a state: a task's own, ``succeeded`` for one saved or expired, and
    ``unknown`` or ``not_found`` where the gateway names none."""
    if state in (State.SAVED, State.EXPIRED):
        return str(TaskStatus.SUCCEEDED)
    return str(state.value)


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def decoded(raw: bytes) -> str:
    """The reading connections' text factory: bytes that are not UTF-8 (a damaged row) become
    lone surrogates that :func:`entry_of` refuses, instead of failing the whole query."""
    text: str = raw.decode("utf-8", "surrogateescape")
    return text
