"""The tracker: a journal's unfinished tasks collected through one client (DESIGN 19, 22), on
the tracker's one run loop (``_loop``) with the journal as its store: the tasks of this key and
gateway that no other live process works on (the client claims them), the submits whose outcome
is unknown sent again with their keys (those first sent longer ago than the gateway remembers
keys are reported instead), then every task waited on (all at once, under the client's budget
and learned polls) or asked once, and its results saved soonest-expiring first, a dead link
refreshed; the client records each step in the journal. ``imggw tasks collect`` is this.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread

from .._async_client import AsyncClient
from .._core.config import whole_request
from .._core.exceptions import ImggwError
from .._core.models import DownloadedFile, Task
from .._core.states import WORK, State, Work
from .._core.surfaces import safe_message
from .._core.text import printable
from .._journal.journal import Journal, JournalEntry, Scope
from ._loop import PARTIAL_AFTER, Loop, sweep_partial_files
from ._store import NOT_FOUND, Course, in_order

__all__ = ["CollectReport", "Tracker"]

log = logging.getLogger("imggw_client")
DOWNLOAD_SLOTS = 8  # results downloaded at once by a collect (as `download --from`'s -c)


@dataclass
class CollectReport:
    """What :meth:`Tracker.collect` did, by task id: tasks whose results it saved (``files`` by
    task id), those still running (or whose download is left for a later collect), failed,
    expired before they were saved, and no longer known to the gateway (``not_found``: final,
    never asked again). By idempotency key, submits of unknown outcome: ``stale_keys``, first
    sent longer ago than the gateway remembers keys (``idempotency_window``), so not sent
    again (a second task could be billed: send one yourself only if no task was made for it);
    ``unresolved_keys``, sent again without getting a task back (no answer, or refused),
    kept for a later collect. ``other_scopes``: unfinished tasks of the journal that belong to
    another API key or gateway (another spelling of the base URL counts as another gateway),
    which this collect leaves alone; ``held``: unfinished tasks of this key and gateway that
    another live process holds (it submitted them, or collects them), left to it.

    Example::

        report = await Tracker(client).collect("out/", wait=False)
        if report.running:
            print(f"{len(report.running)} still running: run collect again later")
    """

    saved: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    files: dict[str, list[DownloadedFile]] = field(default_factory=dict)
    not_found: list[str] = field(default_factory=list)
    stale_keys: list[str] = field(default_factory=list)
    unresolved_keys: list[str] = field(default_factory=list)
    other_scopes: int = 0
    held: int = 0

    @property
    def exit_code(self) -> int:
        """0 when everything is saved, 3 when some still run (or a resent submit got no task
        back yet, or another process holds some), 1 when some failed, expired, are not known
        to the gateway, or are stale keys only the caller may send (the CLI's codes)."""
        if self.failed or self.expired or self.not_found or self.stale_keys:
            return 1
        return 3 if self.running or self.unresolved_keys or self.held else 0


@dataclass
class _Entry:
    """A journaled task as the loop's item: submitted by a client of this journal (so a
    NotFound is asked again a few times, and its wait polls by its kind and start). One whose
    submit's outcome is unknown is sent again as it was first sent (``validate`` False: the
    same bytes), unless it first left (``first_sent``) longer ago than the gateway remembers."""

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
    first_sent: float | None = None
    validate: bool = False

    @classmethod
    def of(cls, line: int, entry: JournalEntry) -> _Entry:
        request = entry.request
        started = entry.submitted_at.timestamp() if entry.submitted_at else None
        fields = {
            "prompt": request.prompt,
            "aspect_ratio": request.aspect_ratio,
            "resolution": request.resolution,
        }
        state = State.UNKNOWN if entry.task_id is None else State.RUNNING
        first = entry.created_at.timestamp() if entry.created_at else None
        return cls(
            line,
            entry.surface,
            entry.idempotency_key,
            entry.task_id,
            started,
            fields,
            state,
            first_sent=first,
        )


class _JournalRun:
    """The loop's store and hooks for a collect: the journal's unfinished tasks in memory (the
    client writes each step to the journal itself), their outcomes in a :class:`CollectReport`,
    results saved into ``dest``."""

    def __init__(
        self,
        entries: list[_Entry],
        dest: Path,
        on_task: Callable[[Task], None] | None,
        redact: Callable[[str], str],
        surface: str,
    ) -> None:
        self.entries = entries
        self.surface = surface  # the client's: its tasks' files are named as generate names them
        self.redact = redact  # an exception's text may quote the key
        self.dest = dest
        self.on_task = on_task
        self.report = CollectReport()

    # ------------------------------------------------------------------------ the store

    def chunk(self, after: int) -> list[_Entry]:
        return in_order(self.entries, after)

    def work(self, entry: _Entry) -> Work | None:
        return WORK[entry.state]  # the one table decides what a task still needs

    def sending(self, entry: _Entry) -> None:
        """Nothing to keep: the row's first send was recorded before it first left."""

    def reached(self, entry: _Entry, state: State) -> None:
        entry.state = state
        if state is State.SAVED:
            assert entry.task_id is not None
            self.report.saved.append(entry.task_id)

    def fail(self, entry: _Entry, code: str, message: str) -> None:
        entry.state = State.FAILED
        if entry.task_id is None:  # a resent submit refused: the row keeps its key
            key = entry.idempotency_key or ""
            self.report.unresolved_keys.append(key)
            log.warning(
                "a journaled submit (idempotency key %s) was sent again and refused "
                "(%s); it stays in the journal",
                printable(key, 80),
                printable(code, 80),
            )
        elif code == NOT_FOUND:  # the journal holds it final: no collect asks again
            self.report.not_found.append(entry.task_id)
        else:
            self.report.failed.append(entry.task_id)

    def expire(self, entry: _Entry, message: str) -> None:
        entry.state = State.EXPIRED
        assert entry.task_id is not None
        self.report.expired.append(entry.task_id)

    def left_for_next_run(self, entry: _Entry, why: str) -> None:
        what = f"task {entry.task_id}" if entry.task_id else f"key {entry.idempotency_key}"
        log.warning("%s: %s; a later collect takes it up again", what, why)

    def unexpected_fault(self, entry: _Entry, exc: Exception) -> None:
        log.error(
            "task %s: unexpected %s: %s; a later collect takes it up again",
            entry.task_id,
            type(exc).__name__,
            safe_message(self.redact(str(exc))) or "",
        )

    def landing(self, entry: _Entry) -> Path:
        return self.dest

    def prefix(self, entry: _Entry) -> str:
        """One rule in every command: a task of the client's surface is named by its id alone,
        and one of the other surface (whose ids may be the same) starts with its surface."""
        return "" if entry.surface == self.surface else f"{entry.surface}-"

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

    def finish(self, stale: list[str], other_scopes: int) -> CollectReport:
        """The report, with every task left unsaved counted as still running, and every
        unknown submit not settled as stale or unresolved."""
        report = self.report
        report.stale_keys, report.other_scopes = stale, other_scopes
        for entry in self.entries:
            if WORK[entry.state] is None:
                continue
            if entry.task_id is not None:
                report.running.append(entry.task_id)
            elif entry.idempotency_key not in stale:
                report.unresolved_keys.append(entry.idempotency_key or "")
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
        """Every unfinished task of the journal (this key, this gateway) that no other live
        process works on, brought as far as it goes: a submit of unknown outcome sent again
        with its key (unless first sent longer ago than ``client.idempotency_window``: listed
        in ``stale_keys``, never sent); without ``wait``, each task is asked once; with it,
        waited on (up to ``timeout`` seconds). Finished ones are downloaded into ``dest_dir``,
        the soonest-expiring first (a task whose links carry no expiry goes last), a dead link
        asked for again; partial files a killed collect left there are removed first. A task
        the gateway no longer knows ends ``not_found``, alone. ``on_task`` sees each task as it
        is terminal."""
        client, dest = self.client, Path(dest_dir)
        journal = client.journal
        assert journal is not None
        # A live download ends within its timeout: a partial file quiet for longer is a kill's.
        quiet = max(PARTIAL_AFTER, 2 * whole_request(client.timeout))
        await anyio.to_thread.run_sync(sweep_partial_files, dest, quiet)
        scope = client.journal_scope
        claimed, held = await anyio.to_thread.run_sync(journal._claim, scope)
        others = await anyio.to_thread.run_sync(partial(_elsewhere, journal, scope))
        entries = [_Entry.of(line, entry) for line, entry in enumerate(claimed, 1)]
        run = _JournalRun(entries, dest, on_task, client.redact, client.surface)
        limit = math.inf if timeout is None or not wait else timeout
        course = Course(deadline=time.monotonic() + limit, line_timeout=None, redact=client.redact)
        loop = Loop(client, run, run, course, concurrency=DOWNLOAD_SLOTS, wait=wait)
        await loop.run()
        if course.fatal is not None:
            raise course.fatal
        report = run.finish(course.stale_keys, others)
        report.held = held
        return report


def _elsewhere(journal: Journal, scope: Scope) -> int:
    """Unfinished tasks of the journal that belong to another key or gateway."""
    return journal.count(unfinished=True) - journal.count(unfinished=True, scope=scope)
