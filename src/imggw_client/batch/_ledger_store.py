"""The batch's store to the tracker's loop (``tracking/_store.Store``): a run's items are its
ledger's rows, read in line order; their moves go through ``RunLines`` (held to
``_states.MOVES``, counted, saved in the ledger); their results land in the run's folder (or
its incoming folder, to be named by the template) and go where the run's results belong
(``Workspace.store``).

The loop speaks the task states of ``_core/states.py``, and the ledger keeps them as they are.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from pathlib import Path

from .._core import reasons
from .._core.models import DownloadedFile
from .._core.states import WORK, State, Work
from .._core.text import printable
from .._files import StorageError, cannot, planted_link, refuse_link
from ._naming import INCOMING_DIR, NameTemplate
from ._run import RunLines
from ._schema import Row
from ._states import EXPIRED
from ._workspace import Workspace

__all__ = ["LedgerStore"]

RESULT_EXPIRED = reasons.RESULT_EXPIRED.code
# A saved line whose files keep their default names: the template's could not be used. Kept in
# the row's error columns, a note, not a failure (the manifest shows it as ``warning``).
NAME_NOT_USED = "name_not_used"
# What a filesystem says of a name it cannot hold (too long for it, a character it refuses, a
# folder of that name there): the name's fault, not the disk's.
_NAME_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ, errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY}
)

log = logging.getLogger("imggw_client")


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
