"""A journal is its user's alone (DESIGN 22): its folder and its files belong to the user, are
written by no one else, and are reached through no symbolic link. A journal another user could
write is one whose rows they could plant, and a collect pays for every row it finds: such a
journal is refused (:class:`ConfigurationError`, code ``journal_unsafe``) before anything is
sent, naming the path and the remedy. Folders the journal needs are made here, each 0700.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
from pathlib import Path

from .._core.exceptions import ConfigurationError

__all__ = ["UNSAFE", "ready_folder", "refuse_unsafe_files"]

UNSAFE = "journal_unsafe"
SIDE_FILES = ("-wal", "-shm")  # SQLite's log and shared memory: rows too, for a reader
# Owners and mode bits say who may write only where they are the system's (Windows keeps that
# in access lists, and shows every file as 0666).
POSIX = hasattr(os, "geteuid")


def ready_folder(folder: Path) -> None:
    """Makes ``folder`` (each missing level 0700, as the user's own) and checks that it is
    the user's alone: :class:`ConfigurationError` (``journal_unsafe``) if not."""
    missing = []
    level = folder
    while not os.path.lexists(level) and level != level.parent:
        missing.append(level)
        level = level.parent
    for made in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
            made.mkdir(mode=0o700)
    _refuse_unsafe(folder, folder=True)


def refuse_unsafe_files(path: Path) -> None:
    """Checks the journal's file and SQLite's files beside it, those that exist: each a
    regular file of the user's that no one else may write."""
    for name in (path, Path(f"{path}{SIDE_FILES[0]}"), Path(f"{path}{SIDE_FILES[1]}")):
        if os.path.lexists(name):
            _refuse_unsafe(name, folder=False)


def _refuse_unsafe(path: Path, *, folder: bool) -> None:
    found = os.lstat(path)
    what = "folder" if folder else "file"
    mode = stat.S_IMODE(found.st_mode)
    private = "700" if folder else "600"
    elsewhere = "or give another journal path (IMGGW_JOURNAL, journal=)"
    if stat.S_ISLNK(found.st_mode):
        problem = "is a symbolic link"
        remedy = f"use the real {what} instead, {elsewhere}"
    elif POSIX and found.st_uid != os.geteuid():
        problem = f"belongs to another user (uid {found.st_uid})"
        remedy = "give a journal path of your own (IMGGW_JOURNAL, journal=)"
    elif POSIX and mode & 0o022:
        writers = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
        problem = f"is writable by {writers} (mode {mode:04o})"
        remedy = f"make it yours alone (chmod {private} {shlex.quote(str(path))}) {elsewhere}"
    else:
        if folder and not stat.S_ISDIR(found.st_mode):
            raise NotADirectoryError(20, "not a folder", str(path))
        return
    raise ConfigurationError(
        f"the journal {what} {path} {problem}: another user could plant tasks in it that a "
        f"collect would pay for. Nothing was sent; {remedy}",
        code=UNSAFE,
    )
