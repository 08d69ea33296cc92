"""The tracker: a journal's unfinished tasks collected through one client (DESIGN 19), on the
tracker's one run loop (``_loop``) with the journal as its store: the submits whose outcome is
unknown are sent again with their keys (``client.unfinished()``), then every task is waited on
(all at once, under the client's budget and learned polls) or asked once, and its results
saved soonest-expiring first, a dead link refreshed; the client records each step in the
journal. ``imggw tasks collect`` is this.

Example::

    async with AsyncClient(journal="state/imggw.sqlite") as client:
        report = await Tracker(client).collect("out/", wait=True)
        print(report.saved, report.running, report.failed)
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._async_client import AsyncClient
from .._core.exceptions import ImggwError
from .._core.models import DownloadedFile, Submission, Task
from .._core.states import WORK, State, Work
from .._core.surfaces import safe_message
from ._loop import Loop
from ._store import Course, in_order

__all__ = ["CollectReport", "Tracker"]

log = logging.getLogger("imggw_client")
DOWNLOAD_SLOTS = 8  # results downloaded at once by a collect (as `download --from`'s -c)


@dataclass
class CollectReport:
    """What :meth:`Tracker.collect` did: tasks whose results it saved (``files`` by task id),
    those still running (or whose download is left for a later collect), failed, and expired
    before they were saved.

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


@dataclass
class _Entry:
    """A journaled task as the loop's item: submitted by a client of this journal (so a
    NotFound is asked again a few times, and its wait polls by its kind and start)."""

    line: int
    surface: str
    idempotency_key: str | None
    task_id: str | None
    submitted_at: float | None
    fields: dict[str, Any]
    state: State = State.RUNNING  # whatever the journal said: a wait tells (or asks once)
    urls: list[str] = field(default_factory=list)
    expires_at: float | None = None
    made_here: bool = True

    @classmethod
    def of(cls, line: int, sub: Submission) -> _Entry:
        started = sub.submitted_at.timestamp() if sub.submitted_at else None
        return cls(line, sub.surface, sub.idempotency_key, sub.task_id, started,
                   {"resolution": sub.resolution})  # fmt: skip


class _JournalRun:
    """The loop's store and hooks for a collect: the journal's unfinished tasks in memory (the
    client writes each step to the journal itself), their outcomes in a :class:`CollectReport`,
    results saved into ``dest``."""

    def __init__(self, entries: list[_Entry], dest: Path,
                 on_task: Callable[[Task], None] | None,
                 redact: Callable[[str], str]) -> None:  # fmt: skip
        self.entries = entries
        self.redact = redact  # an exception's text may quote the key
        self.dest = dest
        self.on_task = on_task
        self.report = CollectReport()

    # ------------------------------------------------------------------------ the store

    def chunk(self, after: int) -> list[_Entry]:
        return in_order(self.entries, after)

    def work(self, entry: _Entry) -> Work | None:
        return WORK[entry.state]  # the one table decides what a task still needs

    def reached(self, entry: _Entry, state: State) -> None:
        entry.state = state
        if state is State.SAVED:
            assert entry.task_id is not None
            self.report.saved.append(entry.task_id)

    def fail(self, entry: _Entry, code: str, message: str) -> None:
        entry.state = State.FAILED
        assert entry.task_id is not None
        self.report.failed.append(entry.task_id)

    def expire(self, entry: _Entry, message: str) -> None:
        entry.state = State.EXPIRED
        assert entry.task_id is not None
        self.report.expired.append(entry.task_id)

    def left_for_next_run(self, entry: _Entry, why: str) -> None:
        log.warning("task %s: %s; a later collect takes it up again", entry.task_id, why)

    def unexpected_fault(self, entry: _Entry, exc: Exception) -> None:
        log.error("task %s: unexpected %s: %s; a later collect takes it up again",
                  entry.task_id, type(exc).__name__,
                  safe_message(self.redact(str(exc))) or "")  # fmt: skip

    def landing(self, entry: _Entry) -> Path:
        return self.dest

    def prefix(self, entry: _Entry) -> str:
        """Tasks of both surfaces may share an id: the surface starts each file's name."""
        return f"{entry.surface}-"

    async def keep(self, entry: _Entry, files: list[DownloadedFile]) -> None:
        assert entry.task_id is not None
        self.report.files[entry.task_id] = files

    # ------------------------------------------------------------------------ the hooks

    @contextlib.asynccontextmanager
    async def admit(self, entry: _Entry) -> AsyncIterator[bool]:
        yield True  # a collect submits nothing but what ``unfinished()`` already re-sent

    @contextlib.contextmanager
    def working(self, entry: _Entry) -> Iterator[None]:
        yield

    async def unsent(self, entry: _Entry, err: ImggwError | None) -> None:
        pass

    async def charged(self, entry: _Entry, task: Task, *, final: bool) -> None:
        pass  # the client journals each charge it sees

    async def ended(self, entry: _Entry, task: Task) -> None:
        if self.on_task is not None:
            self.on_task(task)

    async def saved(self, entry: _Entry) -> None:
        pass

    def finish(self) -> CollectReport:
        """The report, with every task left unsaved counted as still running."""
        report = self.report
        report.running.extend(e.task_id for e in self.entries
                              if WORK[e.state] is not None and e.task_id is not None)  # fmt: skip
        return report


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
        (a task whose links carry no expiry goes last), a dead link asked for again. A task
        the gateway does not know fails alone. ``on_task`` sees each task as it is terminal."""
        subs = await self.client.unfinished()
        entries = [_Entry.of(line, sub) for line, sub in enumerate(subs, 1)]
        run = _JournalRun(entries, Path(dest_dir), on_task, self.client.redact)
        limit = math.inf if timeout is None or not wait else timeout
        course = Course(deadline=time.monotonic() + limit, line_timeout=None,
                        redact=self.client.redact)  # fmt: skip
        loop = Loop(self.client, run, run, course, concurrency=DOWNLOAD_SLOTS, wait=wait)
        await loop.run()
        if course.fatal is not None:
            raise course.fatal
        return run.finish()
