"""A run's downloads: finished tasks queue for download slots, the soonest-expiring first
(:class:`DownloadQueue`), and each is saved into the run's folder, verified, and put where the
run's results belong (:class:`Downloads`). A dead link is queried again for a fresh one before
a result is declared expired; a link that carries the API key is kept blanked in the ledger.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import anyio

from .. import _telemetry
from .._async_client import AsyncClient
from .._core import reasons
from .._core.config import check_surface
from .._core.exceptions import DownloadError, ImggwError, NotFoundError, ResultExpiredError
from .._core.models import DownloadedFile, Task, TaskStatus
from .._core.surfaces import REDACTED, redact_url
from .._download import WRITE_FAILED
from .._files import StorageError, refuse_link
from ._ledger import NOT_FOUND
from ._naming import INCOMING_DIR, NameTemplate
from ._run import FATAL, RunLines, retry_later
from ._schema import Row
from ._states import EXPIRED, SAVED
from ._workspace import GalleryPace, Workspace

__all__ = ["DownloadQueue", "Downloads", "kept_links"]

RESULT_EXPIRED = reasons.RESULT_EXPIRED.code


def kept_links(client: AsyncClient, urls: Iterable[str]) -> list[str]:
    """Result links as the ledger keeps them: one that carries the API key (a gateway may sign
    links so) is kept blanked, for no file in the folder holds the key; its download asks the
    gateway for the link again.

    Example::

        kept_links(client, task.image_urls)
    """
    secrets = (client._settings.api_key,)
    return [redact_url(url, secrets) for url in urls]


@dataclass(order=True)
class _Queued:
    """A finished task waiting for a download slot: soonest expiry first, then (unknown
    expiry) in the order they finished."""

    expires: float
    seq: int
    row: Row = field(compare=False)
    done: anyio.Event = field(compare=False)
    context: object = field(compare=False, default=None)  # the line's span, for its download


class DownloadQueue:
    """Finished tasks waiting for a download slot, the soonest-expiring first, and the pace
    of recent downloads (what tells which results are at risk of expiring in the queue).

    Example::

        queue = DownloadQueue()
        await queue.put(row)        # returns once a slot has saved it (or given up)
        await queue.serve(save)     # one slot, forever
    """

    def __init__(self) -> None:
        self._heap: list[_Queued] = []
        self._ready = anyio.Semaphore(0)
        self._order = itertools.count()
        self.downloaded: deque[float] = deque(maxlen=64)  # when recent downloads ended

    def __len__(self) -> int:
        return len(self._heap)

    async def put(self, row: Row) -> None:
        """Queues the row for a download slot and waits for its turn to end."""
        item = _Queued(row.expires_at or math.inf, next(self._order), row, anyio.Event(),
                       _telemetry.current())  # fmt: skip
        heapq.heappush(self._heap, item)
        self._ready.release()
        await item.done.wait()

    async def serve(self, save: Callable[[Row], Awaitable[None]]) -> None:
        """One download slot: always the queued result whose links die first."""
        while True:
            await self._ready.acquire()
            item = heapq.heappop(self._heap)
            try:
                with _telemetry.resumed(item.context):
                    await save(item.row)
            finally:
                item.done.set()

    def expiries(self) -> list[float]:
        """The known link expiries of the queued results (Unix seconds), soonest first."""
        return sorted(q.expires for q in self._heap if math.isfinite(q.expires))

    def at_risk(self, expiries: list[float]) -> int:
        """Queued results whose links die before their turn at the recent download pace."""
        if not expiries or len(self.downloaded) < 2:
            return 0
        span = self.downloaded[-1] - self.downloaded[0]
        pace = (len(self.downloaded) - 1) / span if span > 0 else math.inf
        now = time.time()
        return sum(1 for turn, expires in enumerate(expiries) if now + turn / pace > expires)


class Downloads:
    """The download step of a run's lines: queued (:meth:`download`), then saved by one of
    the slots (:meth:`slot`) into ``work``; ``surface`` is the run's (a task of the other
    surface has its files' names start with its own); ``template`` names the files (default:
    ``{task_id}-{index}``).

    Example::

        downloads = Downloads(client, run, work, "beta")
        group.start_soon(downloads.slot)
        await downloads.download(row)
    """

    def __init__(self, client: AsyncClient, run: RunLines, work: Workspace, surface: str,
                 template: NameTemplate | None = None) -> None:  # fmt: skip
        self.client = client
        self.template = None if template is None or template.is_default else template
        self.run = run
        self.work = work
        self.surface = surface
        self.queue = DownloadQueue()
        self.gallery = GalleryPace(work)

    async def download(self, row: Row) -> None:
        """Queues the row for a download slot (soonest expiry first) and waits for its turn."""
        if not row.urls:
            self.run.fail(row, "no_result", f"task {row.task_id} succeeded without result URLs")
            return
        await self.queue.put(row)

    async def slot(self) -> None:
        """One download slot; a fault of one line's download ends only that line's step."""
        await self.queue.serve(self._save)

    async def _save(self, row: Row) -> None:
        try:
            await self.save_results(row)
        except FATAL as err:
            self.run.stop(err)
        except Exception as exc:  # one line's fault must not end the run
            self.run.unexpected_fault(row, exc)

    async def save_results(self, row: Row) -> None:
        """Saves the row's results into the run's folder, verified, and puts them where they
        belong; the line moves to ``saved``, ``expired`` or ``failed``, or stays where it
        stands for a later try (out of time, a query for fresh links that failed)."""
        assert row.task_id is not None
        run = self.run
        expires = (
            datetime.fromtimestamp(row.expires_at, tz=timezone.utc) if row.expires_at else None
        )
        task = Task(
            id=row.task_id,
            surface=check_surface(row.surface),
            status=TaskStatus.SUCCEEDED,
            image_urls=row.urls,
            expires_at=expires,
        )
        try:
            async for attempt in run.retrying(run.line_deadline()):
                with attempt:
                    if any(REDACTED in url for url in task.image_urls):
                        # A link the ledger keeps blanked (it carried the key): the gateway
                        # hands it out again on a query.
                        task = await self.client.get(task.id, surface=task.surface)
                    files = await self.client.download(
                        task, self.landing(), overwrite=True, prefix=self.file_prefix(row)
                    )
        except ResultExpiredError as err:  # the fresh links failed too: really gone
            message = err.message
            if row.files:  # saved by an earlier run: it did not expire before its download
                message = (
                    "the files saved earlier are gone from the folder, and the gateway no "
                    f"longer has the result ({message})"
                )
            row.error_code, row.error_message = RESULT_EXPIRED, message
            run.move(row, EXPIRED)
            return
        except DownloadError as err:
            if err.code == WRITE_FAILED:  # the disk, not the link: the run stops here
                raise StorageError(
                    f"{err.message}; fix that, then run the same command to resume",
                    code="storage_failed",
                ) from err
            if not retry_later(err):
                run.fail(row, err.code or "download_failed", err.message)
            return
        except FATAL:
            raise
        except NotFoundError as err:  # its links dead, and the gateway does not know the task
            run.fail(row, NOT_FOUND, err.message)
            return
        except ImggwError as err:
            # The query for fresh links was refused or failed: it says nothing of the result,
            # which a later run fetches.
            if not retry_later(err):
                run.left_for_next_run(row, f"its download failed ({run.why(err)})")
            return  # out of time: a later run downloads it
        if self.template is not None:
            files = self.named(row, files)
        await self.work.store.keep(files)
        self.queue.downloaded.append(time.monotonic())
        row.urls = kept_links(self.client, [f.url for f in files])
        row.files = [{"path": f.path.name, "sha256": f.sha256, "size": f.size} for f in files]
        run.move(row, SAVED)
        await self.gallery.maybe()

    def landing(self) -> Path:
        """Where a download lands: the folder, or with a template its incoming folder."""
        if self.template is None:
            return self.work.folder
        incoming = self.work.folder / INCOMING_DIR
        refuse_link(incoming)
        incoming.mkdir(exist_ok=True)
        return incoming

    def named(self, row: Row, files: list[DownloadedFile]) -> list[DownloadedFile]:
        """The files just saved, renamed into the folder by the template (the extension
        the content gave them kept). A disk that refuses is the run's end, as a failed write."""
        assert self.template is not None
        named = []
        for index, saved in enumerate(files):
            stem = self.file_prefix(row) + self.template.render(row, index)
            target = self.work.folder / (stem + saved.path.suffix)
            try:
                refuse_link(target)
                os.replace(saved.path, target)
            except OSError as exc:
                raise StorageError(
                    f"cannot name {target}: {exc.strerror}; fix that, then run the same command "
                    "to resume", code="storage_failed",
                ) from exc  # fmt: skip
            named.append(saved.model_copy(update={"path": target}))
        return named

    def file_prefix(self, row: Row) -> str:
        """Task ids are per surface: a task of the other surface may share an id with one of
        the run's, so its files' names start with its surface."""
        return "" if row.surface == self.surface else f"{row.surface}-"
