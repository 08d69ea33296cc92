"""Where a run works (:class:`Workspace`): the folder that holds its ledger and receives its
results, where those results belong (a :class:`ResultStore`: the folder itself, or a shard's
output folder, maybe on an object store), and what the run writes there besides its results:
``manifest.jsonl`` and the gallery, at the end and now and then while it goes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread

from .._core.models import DownloadedFile
from .._files import refuse_link
from ._gallery import write_gallery
from ._ledger import STOPPED_BY, Ledger
from ._manifest import manifest_rows, write_manifest
from ._naming import INCOMING_DIR
from ._plan import WHOLE, IdentityStore, Slice
from ._schema import Row, storage_error
from ._states import SAVED

__all__ = ["GALLERY_EVERY", "LocalStore", "ResultStore", "Workspace", "file_sha256"]

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
