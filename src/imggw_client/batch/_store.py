"""The batch's store to the tracker's loop (``tracking/_store.Store``): a run's items are its
ledger's rows, read in line order; their moves go through :class:`RunLines` (held to
``_schema.MOVES``, counted, saved in the ledger); their results land in the run's folder (or
its incoming folder, to be named by the template) and go where the run's results belong
(:class:`Workspace`: the folder itself, or a shard's output folder, maybe on an object store,
with ``manifest.jsonl`` and the gallery written there at the end and now and then while it
goes). The loop speaks the task states of ``_core/states.py``, and the ledger keeps them as
they are.

What a failure means for a line: tried again later in this run, left where it stands for the
next run (with its key), or the end of the run. What was paid for is never lost to this run's
own limits: a line with a task id fails only when its task failed (or its result expired, or
the gateway says it does not know the task); any other error leaves it where it stands for the
next run. A run's time, retries and end are the tracker's ``Course``, which ``RunLines``
extends.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread

from .._core import reasons
from .._core.models import DownloadedFile
from .._core.states import WORK, State, Work
from .._core.surfaces import safe_message
from .._core.text import printable
from .._files import StorageError, cannot, planted_link, refuse_link
from ..tracking._store import FATAL, Course, retry_later
from ._gallery import write_gallery
from ._identity import IdentityStore
from ._ledger import STOPPED_BY, Ledger, Totals
from ._plan import INCOMING_DIR, WHOLE, NameTemplate, Slice
from ._report import manifest_rows, write_manifest
from ._schema import (
    EXPIRED,
    FAILED,
    FINAL,
    MOVES,
    SAVED,
    SUCCEEDED,
    Row,
    line_state,
    storage_error,
)

__all__ = [
    "FATAL",
    "GALLERY_EVERY",
    "LedgerStore",
    "LocalStore",
    "ResultStore",
    "RunLines",
    "Workspace",
    "file_sha256",
    "retry_later",
]


log = logging.getLogger("imggw_client")
UNEXPECTED_LOGGED = 20  # faults no rule covers, logged one by one; the rest are counted
LEFT_LOGGED = 20  # lines left for the next run (a query error, the line timeout) logged one by one


class Amount(Protocol):
    """What a line was charged (a ``Charge`` of the admission): credits and cost, None when
    not stated."""

    @property
    def credits(self) -> float | None: ...

    @property
    def cost(self) -> float | None: ...


class Mover(Protocol):
    """Told of each move before it is made (the room a run's results take)."""

    def moved(self, row: Row, state: State) -> None: ...


def _unknown_cost(charge: Amount) -> int:
    """1 for a line charged in credits with no cost stated (as ``Totals.cost_unknown``)."""
    return int(charge.credits is not None and charge.cost is None)


class RunLines(Course):
    """The lines of one run over a planned ledger: their counts and money (from ``totals``,
    then kept up to date), their moves, and the run's end (``fatal``, ``cancel``) or the end of
    its submits (``stopped``, and the guard that stopped them: ``stopped_by``).
    """

    def __init__(
        self,
        ledger: Ledger,
        totals: Totals,
        room: Mover,
        *,
        deadline: float,
        line_timeout: float | None,
        redact: Callable[[str], str],
    ) -> None:
        super().__init__(deadline=deadline, line_timeout=line_timeout, redact=redact)
        self.ledger = ledger
        self.room = room
        self.counts: Counter[State] = totals.counts
        self.credits, self.cost = totals.credits, totals.cost
        self.cost_unknown = totals.cost_unknown
        self.total = sum(self.counts.values())
        self.started = time.monotonic()
        self.finished_here = 0
        self.unexpected = 0
        self.left = 0  # lines left for the next run by a query error or the line timeout
        # Progress, told after each move and at once (True) when submits stop; the run's
        # progress reads the loop's download queue, so it is made after the loop, and this run.
        self.tell: Callable[[bool], None] = lambda at_once: None

    # ------------------------------------------------------------------------ moves

    def move(self, row: Row, state: State, *, at_once: bool = False) -> None:
        """Moves the row to ``state`` (one of the moves ``_schema.MOVES`` allows), keeps the
        counts, and queues the row for the ledger (``at_once``: writes it now, in this thread,
        before a run begins)."""
        if state not in MOVES[row.state]:
            raise AssertionError(
                f"line {row.line}: no move from {row.state.value} to {state.value}"
            )
        self.counts[row.state] -= 1
        self.counts[state] += 1
        self.room.moved(row, state)
        row.state = state
        now = time.time()
        if state is SUCCEEDED and row.completed_at is None:
            row.completed_at = now
        if state in FINAL:
            self.finished_here += 1
            row.finished_at = now
        if at_once:
            self.ledger.save_now(row)
            return
        self.ledger.save(row)
        self.tell(False)

    def fail(self, row: Row, code: str, message: str) -> None:
        """The line failed, with ``code`` and ``message`` kept for its manifest row."""
        row.error_code, row.error_message = code, message
        self.move(row, FAILED)

    def charged(self, before: Amount, now: Amount) -> None:
        """A line's charge went from ``before`` to ``now``: the run's money follows."""
        self.credits += (now.credits or 0) - (before.credits or 0)
        self.cost += (now.cost or 0) - (before.cost or 0)
        self.cost_unknown += _unknown_cost(now) - _unknown_cost(before)

    # ------------------------------------------------------------------------ failures

    def unexpected_fault(self, row: Row, exc: Exception) -> None:
        """A fault no rule covers (a bug here or beneath): one line's step, not the run. The
        line keeps the state last saved, so the next run takes it up again, with its key."""
        self.unexpected += 1
        if self.unexpected > UNEXPECTED_LOGGED:
            return
        frame = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" at {Path(frame[0].filename).name}:{frame[0].lineno}" if frame else ""
        # Only the type, place and a cleaned message: an exception's text may quote a header.
        log.error(
            "line %d: unexpected %s%s: %s; the line stays unfinished for the next run%s",
            row.line,
            type(exc).__name__,
            where,
            safe_message(self.redact(str(exc))) or "",
            "; later ones are counted, not logged" if self.unexpected == UNEXPECTED_LOGGED else "",
        )

    def left_for_next_run(self, row: Row, why: str) -> None:
        """The line keeps its state (and its key) for the next run, which takes it up again:
        said in the log, one by one for the first few."""
        self.left += 1
        if self.left <= LEFT_LOGGED:
            log.warning(
                "line %d (task %s): %s; it stays %s for the next run%s",
                row.line,
                row.task_id,
                why,
                line_state(row.state),
                "; later ones are counted, not logged" if self.left == LEFT_LOGGED else "",
            )


GALLERY_EVERY = 30.0  # seconds between gallery rewrites during a run (and at least 20x its cost)


class ResultStore(Protocol):
    """Where a run's results and manifest belong: the run's own folder (nothing to do), or a
    shard's output folder, shared by every shard and maybe on an object store."""

    async def keep(self, files: list[DownloadedFile]) -> None:
        """Puts files just saved and verified in the run's folder in their place."""

    def is_whole(self, name: str, size: int, sha256: str, *, hashes: bool) -> bool:
        """Whether a result kept earlier is there and whole (blocking)."""

    def finish(self, manifest: Path) -> None:
        """The run ends: its ledger is flushed and its manifest written (blocking)."""


def file_sha256(path: Path) -> str | None:
    """The file's sha256, or None if it cannot be read."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _kept_file(entry: object) -> tuple[str, int, str] | None:
    """A saved file as a ledger row lists it (name, size, sha256), or None when the entry is
    not one: a ledger may come back from shared storage, and a name there is a file of the
    folder's own, never a path elsewhere. A line listing such an entry is downloaded again."""
    if not isinstance(entry, dict):
        return None
    name, size, sha256 = entry.get("path"), entry.get("size"), entry.get("sha256")
    if not isinstance(name, str) or not isinstance(size, int) or not isinstance(sha256, str):
        return None
    if Path(name).name != name or name in ("", ".", "..") or name.startswith("."):
        return None
    return name, size, sha256


class LocalStore:
    """Results left where the run saves them: its own folder (a single run)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def keep(self, files: list[DownloadedFile]) -> None:
        pass

    def is_whole(self, name: str, size: int, sha256: str, *, hashes: bool) -> bool:
        path = self.folder / name
        # A link planted where a saved image was would otherwise count as the image (a paid
        # result never saved again): refused, naming it, as anywhere in the folder.
        refuse_link(path)
        try:
            whole = path.stat().st_size == size
        except OSError:
            whole = False
        return whole and (not hashes or file_sha256(path) == sha256)

    def finish(self, manifest: Path) -> None:
        pass


@dataclass
class Workspace:
    """Where a run works: ``folder`` (on this machine) holds its ledger and receives its
    results; ``store`` puts them where they belong; ``identity`` keeps the run's identity;
    ``part`` is the part of the input it reads; ``gallery`` the title of the gallery it writes
    as it goes (None: none).
    """

    folder: Path
    ledger: Ledger
    identity: IdentityStore
    store: ResultStore
    part: Slice = WHOLE
    gallery: str | None = None

    def damaged(self, *, hashes: bool) -> Iterator[Row]:
        """Saved lines whose files are missing or damaged: a size check by default, every
        file's sha256 with ``hashes``. Blocking; before the run."""
        for row in self.ledger.iter_rows(states=(SAVED,)):
            for f in row.files:
                kept = _kept_file(f)
                if kept is None or not self.store.is_whole(*kept, hashes=hashes):
                    yield row
                    break

    def sweep_partial_files(self) -> None:
        """Temp files of downloads cut short by a kill: the run holds the folder's lock, so no
        live run owns them. Blocking. A link planted where the incoming folder goes stops the
        run here (its files would be removed wherever it points)."""
        refuse_link(self.folder / INCOMING_DIR)
        for pattern in (".*.part", f"{INCOMING_DIR}/.*.part"):
            for leftover in self.folder.glob(pattern):
                leftover.unlink(missing_ok=True)

    def write_gallery(self) -> None:
        """The gallery of every line as the ledger has it now. Blocking."""
        assert self.gallery is not None
        self.ledger.flush()
        try:
            rows = manifest_rows(self.ledger.iter_rows())
            write_gallery(self.folder, rows, title=self.gallery)
        except OSError as exc:
            raise storage_error(self.folder, exc) from exc

    def write_outputs(self, stopped_by: str | None) -> Path:
        """The manifest and the gallery, and the store told the run ended; ``stopped_by`` is
        kept for ``imggw batch status`` (cleared by a run that was not stopped: its line
        states say the rest). The ledger must be flushed first. Blocking."""
        self.ledger.set_meta(STOPPED_BY, stopped_by)
        manifest = write_manifest(self.folder, manifest_rows(self.ledger.iter_rows()))
        if self.gallery is not None:
            self.write_gallery()
        self.store.finish(manifest)
        return manifest


class GalleryPace:
    """The gallery rewritten now and then as lines finish (never more than 5% of the time), so
    a long run can be looked at while it goes.
    """

    def __init__(self, work: Workspace) -> None:
        self.work = work
        self.last = time.monotonic()
        self.cost = 0.0

    async def maybe(self) -> None:
        """Rewrites the gallery if it is time to (a run that writes none: never)."""
        if self.work.gallery is None:
            return
        now = time.monotonic()
        if now - self.last < max(GALLERY_EVERY, 20 * self.cost):
            return
        self.last = now
        await anyio.to_thread.run_sync(self.work.write_gallery)
        self.cost = time.monotonic() - now


RESULT_EXPIRED = reasons.RESULT_EXPIRED.code
# A saved line whose files keep their default names: the template's could not be used. Kept in
# the row's error columns, a note, not a failure (the manifest shows it as ``warning``).
NAME_NOT_USED = "name_not_used"
# What a filesystem says of a name it cannot hold (too long for it, a character it refuses, a
# folder of that name there): the name's fault, not the disk's.
_NAME_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ, errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY}
)


class LedgerStore:
    """The rows of ``run``'s ledger as the loop's items, their results saved into ``work``;
    ``surface`` is the run's (a task of the other surface has its files' names start with its
    own); ``template`` names the files (default: ``{task_id}-{index}``).
    """

    def __init__(
        self, run: RunLines, work: Workspace, surface: str, template: NameTemplate | None = None
    ) -> None:
        self.run = run
        self.space = work
        self.surface = surface
        self.template = None if template is None or template.is_default else template

    def chunk(self, after: int) -> list[Row]:
        """The ledger's next rows after line ``after``. Blocking."""
        return self.space.ledger.next_rows(after)

    def work(self, row: Row) -> Work | None:
        """What the line needs now, by its state (None: final)."""
        return WORK[row.state]

    def sending(self, row: Row) -> None:
        """The line's first send is kept (once) for the gateway's key memory: a later run
        never sends an unknown submit again once its key may be forgotten. Queued to the
        ledger's writer like every move, so it lands with the next commit."""
        if row.first_sent is None:
            row.first_sent = time.time()
            self.space.ledger.save(row)

    def reached(self, row: Row, state: State) -> None:
        """The line moves to the state its task reached."""
        self.run.move(row, state)

    def fail(self, row: Row, code: str, message: str) -> None:
        """The line failed, its code and message kept for its manifest row."""
        self.run.fail(row, code, message)

    def expire(self, row: Row, message: str) -> None:
        """The line's results are gone; one saved by an earlier run says its files are gone
        too (it did not expire before its download)."""
        if row.files:
            message = (
                "the files saved earlier are gone from the folder, and the gateway no "
                f"longer has the result ({message})"
            )
        row.error_code, row.error_message = RESULT_EXPIRED, message
        self.run.move(row, EXPIRED)

    def left_for_next_run(self, row: Row, why: str) -> None:
        """The line stays where it stands for the next run (said in the log)."""
        self.run.left_for_next_run(row, why)

    def unexpected_fault(self, row: Row, exc: Exception) -> None:
        """A fault no rule covers: logged; the line keeps its last saved state."""
        self.run.unexpected_fault(row, exc)

    def landing(self, row: Row) -> Path:
        """Where a download lands: the folder, or with a template its incoming folder."""
        if self.template is None:
            return self.space.folder
        incoming = self.space.folder / INCOMING_DIR
        refuse_link(incoming)
        try:
            incoming.mkdir(exist_ok=True)
        except OSError as exc:  # the disk, not the line: the run stops here, as a failed write
            raise cannot(incoming, exc, "create") from exc
        return incoming

    def prefix(self, row: Row) -> str:
        """Task ids are per surface: a task of the other surface may share an id with one of
        the run's, so its files' names start with its surface."""
        return "" if row.surface == self.surface else f"{row.surface}-"

    async def keep(self, row: Row, files: list[DownloadedFile]) -> None:
        """The line's files named by the template, put where the run's results belong, and
        listed in its row."""
        if self.template is not None:
            files = self.named(row, files)
        await self.space.store.keep(files)
        row.files = [{"path": f.path.name, "sha256": f.sha256, "size": f.size} for f in files]

    def named(self, row: Row, files: list[DownloadedFile]) -> list[DownloadedFile]:
        """The files just saved, renamed into the folder by the template (the extension
        the content gave them kept). The result is paid for: a name the folder cannot take
        (too long for its filesystem, another line's file there) leaves the file its default
        name, and the line says so (:data:`NAME_NOT_USED`, and a warning). A disk that refuses,
        or a link planted where a file goes, is the run's end, as a failed write."""
        assert self.template is not None
        own = {str(f.get("path")) for f in row.files}  # this line's, from an earlier save
        named, refused = [], []
        for index, saved in enumerate(files):
            stem = self.prefix(row) + self.template.render(row, index)
            target = self.space.folder / (stem + saved.path.suffix)
            why = _rename(saved.path, target, own)
            if why is not None:
                refused.append(f"{printable(target.name, 80)!r} ({why})")
                target = self.space.folder / saved.path.name  # the task's own: the default
                if _rename(saved.path, target, own) is not None:
                    raise StorageError(
                        f"cannot name line {row.line}'s result {target}: that file is there "
                        "already and is not this line's; move it away, then run the same "
                        "command to resume",
                        code="name_taken",
                    )
            named.append(saved.model_copy(update={"path": target}))
        if refused:
            row.error_code = NAME_NOT_USED
            row.error_message = (
                f"the name template gave {', '.join(refused)}, which this folder cannot take; "
                "saved under the default name instead"
            )
            log.warning("line %d: %s", row.line, row.error_message)
        elif row.error_code == NAME_NOT_USED:  # named as asked this time
            row.error_code = row.error_message = None
        return named


def _rename(source: Path, target: Path, own: set[str]) -> str | None:
    """Moves ``source`` to ``target``, or says why that name cannot be used (None: moved)."""
    try:
        found: os.stat_result | None = os.lstat(target)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        if exc.errno in _NAME_ERRNOS:
            return exc.strerror or "a name this filesystem refuses"
        raise cannot(target, exc, "read") from exc
    if found is not None and stat.S_ISLNK(found.st_mode):
        raise planted_link(target)
    # The plan refuses lines whose first files share a name; a task's later results (``-1``,
    # ``-2`` without ``{index}``) can still meet another line's name, or a file put there:
    # never replace a file that is not this line's own.
    if found is not None and target.name not in own:
        return "another file has that name"
    try:
        os.replace(source, target)
    except OSError as exc:
        if exc.errno in _NAME_ERRNOS:
            return exc.strerror or "a name this filesystem refuses"
        raise cannot(target, exc, "name") from exc
    return None
