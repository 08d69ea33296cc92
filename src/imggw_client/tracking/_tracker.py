"""The tracker: a journal's unfinished tasks collected through one client (DESIGN 19): the
submits whose outcome is unknown sent again with their keys, then every task waited on (all
at once, under the client's budget) and its results saved soonest-expiring first, each file
recorded in the journal. ``imggw tasks collect`` is this, fed with the journal.

Example::

    async with AsyncClient(journal="state/imggw.sqlite") as client:
        report = await Tracker(client).collect("out/", wait=True)
        print(report.saved, report.running, report.failed)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .._async_client import AsyncClient
from .._core.exceptions import ResultExpiredError, WaitTimeoutError
from .._core.models import DownloadedFile, Task, TaskStatus

__all__ = ["CollectReport", "Tracker"]


@dataclass
class CollectReport:
    """What :meth:`Tracker.collect` did: tasks whose results it saved (``files`` by task id),
    those still running, failed, and expired before they were saved.

    Example::

        if report.running:
            print(f"{len(report.running)} still running: run collect again later")
    """

    saved: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    files: dict[str, list[DownloadedFile]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when everything is saved, 3 when some still run, 1 when some failed or expired
        (the CLI's codes)."""
        if self.failed or self.expired:
            return 1
        return 3 if self.running else 0


class Tracker:
    """Collects what a client's journal holds (see the module's docstring). ``client`` must
    keep a journal.

    Example::

        report = await Tracker(client).collect("out/", wait=False)
    """

    def __init__(self, client: AsyncClient) -> None:
        if client.journal is None:
            raise ValueError("a Tracker needs a client with a journal (journal=...)")
        self.client = client

    async def collect(
        self,
        dest_dir: str | os.PathLike[str],
        *,
        wait: bool = False,
        timeout: float | None = None,
        on_task: Callable[[Task], None] | None = None,
    ) -> CollectReport:
        """Every unfinished task of the journal (this key, this gateway) brought as far as it
        goes: without ``wait``, each is asked once; with it, waited on (up to ``timeout``
        seconds). Finished ones are downloaded into ``dest_dir``, the soonest-expiring first
        (a task whose links carry no expiry goes last). ``on_task`` sees each task as it is
        terminal."""
        report = CollectReport()
        dest = Path(dest_dir)
        subs = await self.client.unfinished()
        limit = (math.inf if timeout is None else timeout) if wait else 0.0
        finished: list[Task] = []
        try:
            async for task in self.client.as_completed(subs, timeout=limit):
                if on_task is not None:
                    on_task(task)
                if task.status is TaskStatus.SUCCEEDED:
                    finished.append(task)
                else:
                    report.failed.append(task.id)
        except WaitTimeoutError as err:
            report.running.extend(err.still_running)
        for task in sorted(finished, key=_expiry):
            try:
                report.files[task.id] = await self.client.download(task, dest, prefix=_prefix(task))
                report.saved.append(task.id)
            except ResultExpiredError:
                report.expired.append(task.id)
        return report


def _expiry(task: Task) -> datetime:
    return task.expires_at or datetime.max.replace(tzinfo=timezone.utc)


def _prefix(task: Task) -> str:
    """Tasks of both surfaces may share an id: the surface starts each file's name."""
    return f"{task.surface}-"
