"""The files imggw writes into an output folder, made so that no one else's can be written
through: never through a symbolic link imggw did not make (``O_NOFOLLOW``, and a link found
where a file goes refused, naming it), never onto a file that was there (``O_EXCL``), under a
temporary name no one can guess, moved into place whole. And the one error of a folder that
cannot be written, :class:`StorageError`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from ._core.exceptions import ImggwError

__all__ = [
    "READ_FLAGS",
    "StorageError",
    "atomic_write",
    "cannot",
    "create_new",
    "make_private",
    "open_private",
    "planted_link",
    "refuse_link",
    "refuse_links",
    "temp_name",
]


class StorageError(ImggwError):
    """The output folder or its ledger could not be written (a full disk, a read-only folder):
    the run stopped, with everything it learned so far saved; the same command resumes it.

    Example::

        from imggw_client.batch import run_batch
        from imggw_client.tracking import StorageError

        try:
            report = run_batch("prompts.jsonl", "out/")
        except StorageError as err:
            print(err.message)   # names the path and what the system said
    """


def cannot(path: Path | str, exc: BaseException, verb: str = "write") -> StorageError:
    """The error of a file of the folder that could not be read or written, naming it and
    what the system said."""
    why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return StorageError(
        f"cannot {verb} {path} ({why}); fix that, then run the same command to resume",
        code="storage_failed",
    )


# A temporary file's name holds this many random bytes: no one can guess it to plant a link
# there first (and O_EXCL refuses one planted all the same).
TEMP_BYTES = 16
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # Windows has no symlinks to plant in this way
_BINARY = getattr(os, "O_BINARY", 0)
# How a file of the folder is opened to be read: never through a symbolic link.
READ_FLAGS = os.O_RDONLY | _NOFOLLOW | _BINARY


def planted_link(path: Path | str) -> StorageError:
    """The error of a symbolic link found where imggw writes a file of its own (exit 4)."""
    return StorageError(
        f"{path} is a symbolic link, which imggw did not make and never writes (or reads) "
        "through: it may point at any file. Remove it (or use another output folder), then run "
        "the same command",
        code="symlink_refused",
    )


def refuse_link(path: Path | str) -> None:
    """Raises :func:`planted_link` if a symbolic link is at ``path`` (nothing there is fine)."""
    try:
        found = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there, nor a folder to hold it
        return
    except OSError as exc:
        raise cannot(path, exc, "read") from exc
    if stat.S_ISLNK(found.st_mode):
        raise planted_link(path)


def refuse_links(folder: Path, names: Iterable[str]) -> None:
    """:func:`refuse_link` for each of a folder's files: what a run checks before it plans,
    so that a link planted where its manifest goes stops it before anything is paid for."""
    for name in names:
        refuse_link(folder / name)


def temp_name(path: Path) -> Path:
    """A name beside ``path`` for its next version while it is written: unpredictable."""
    return path.with_name(f".{path.name}.{secrets.token_hex(TEMP_BYTES)}.part")


def create_new(path: Path, mode: int = 0o666) -> int:
    """A file made here and now, open for writing: never one that was there, never through a
    symbolic link (``O_EXCL|O_NOFOLLOW``). ``mode``: 0o600 for a file others may not read."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY
    try:
        return os.open(path, flags, mode)
    except FileExistsError:
        refuse_link(path)
        raise


def open_private(path: Path) -> None:
    """Makes sure ``path`` is a regular file of ours to open (a database SQLite opens itself):
    a symbolic link there is refused; a new file is made 0600 (``O_EXCL|O_NOFOLLOW``), and
    one made before ledgers were private is made so, if it is this user's."""
    refuse_link(path)
    try:
        os.close(create_new(path, 0o600))
    except FileExistsError:
        make_private(path)


def make_private(path: Path) -> None:
    """Takes group and other permissions off a regular file of this user's."""
    found = os.lstat(path)
    mine = not hasattr(os, "getuid") or found.st_uid == os.getuid()
    if mine and stat.S_ISREG(found.st_mode) and stat.S_IMODE(found.st_mode) & 0o077:
        os.chmod(path, 0o600)


@contextlib.contextmanager
def atomic_write(path: Path, *, mode: int = 0o666) -> Iterator[BinaryIO]:
    """Writes ``path`` whole or not at all: a new file under an unpredictable name beside it
    (``O_EXCL|O_NOFOLLOW``), synced, then moved into place. A symbolic link at ``path`` is
    refused (:class:`StorageError`, naming it), before and after the writing. Every file
    imggw writes into an output folder goes through here.
    """
    refuse_link(path)
    tmp = temp_name(path)
    handle = os.fdopen(create_new(tmp, mode), "wb")
    try:
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        refuse_link(path)  # planted while the file was written
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
