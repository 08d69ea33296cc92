"""The batch runner: every line through submit -> wait -> download, bounded, resumable.

Each line's progress is in the ledger before the next step depends on it, so a run killed at any
moment resumes where it was: a line with a key and no task id is submitted again with that key
(the gateway replays the task), known task ids are waited on, missing or corrupt files are
downloaded again, finished lines are left alone.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from .._async_client import AsyncClient
from .._config import RateLimit, check_surface
from .._core.retry import classify
from .._exceptions import (
    AuthenticationError,
    DownloadError,
    ImggwError,
    InsufficientCreditsError,
    PermissionDeniedError,
    RateLimitError,
    RequestValidationError,
    ResultExpiredError,
    TaskFailedError,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from .._models import Task, TaskStatus
from ._input import BadLine, BatchInputError, read_lines
from ._ledger import (
    DONE,
    EXPIRED,
    FAILED,
    FINAL,
    PENDING,
    SUBMITTED,
    SUCCEEDED,
    Ledger,
    Row,
)

MANIFEST_NAME = "manifest.jsonl"
# Failures that doom every line alike: the run stops.
FATAL = (AuthenticationError, PermissionDeniedError, InsufficientCreditsError)
RETRY_PAUSE = (0.5, 10.0)  # first and longest pause before a line's step is tried again


@dataclass(frozen=True)
class BatchProgress:
    """A snapshot for progress displays: counts per state, money, speed, the request budget and
    the results waiting for download.

    ``rate_limit`` is the client's budget; ``least_time_left`` the fewest seconds it allows for
    the lines not yet submitted (None without a submit ceiling). ``awaiting_download`` counts
    finished results waiting for a download slot, ``soonest_expiry`` is the earliest link
    expiry among them, and ``at_risk`` how many of them will, at the current pace, expire
    before their turn.

    Example::

        run_batch("prompts.jsonl", "out/", on_progress=lambda p: print(p.counts, p.eta))
    """

    total: int
    counts: dict[str, int]
    credits: float
    cost: float
    elapsed: float
    finished_this_run: int
    rate_limit: RateLimit | None = None
    least_time_left: float | None = None
    awaiting_download: int = 0
    soonest_expiry: datetime | None = None
    at_risk: int = 0

    @property
    def finished(self) -> int:
        return sum(self.counts.get(state, 0) for state in FINAL)

    @property
    def throughput(self) -> float:
        """Lines finished per second in this run."""
        return self.finished_this_run / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds until every line is finished at the current pace, if it can be told."""
        left = self.total - self.finished
        return left / self.throughput if self.throughput > 0 else None


@dataclass
class BatchReport:
    """What a run did. ``exit_code``: 0 all succeeded, 3 some still unfinished (run again to
    resume), 1 some failed or expired.

    Example::

        report = run_batch("prompts.jsonl", "out/")
        print(report.counts, report.credits, report.manifest)
    """

    rows: list[Row]
    bad_lines: list[BadLine]
    changed_lines: list[int]
    manifest: Path
    elapsed: float
    counts: dict[str, int] = field(default_factory=dict)
    credits: float = 0.0
    cost: float = 0.0

    @property
    def exit_code(self) -> int:
        if any(row.state not in FINAL for row in self.rows):
            return 3
        if self.bad_lines or any(row.state != DONE for row in self.rows):
            return 1
        return 0


def manifest_record(row: Row) -> dict[str, Any]:
    """One manifest line (DESIGN 7's pinned fields, plus the caller's ``id``)."""
    status = {
        PENDING: TaskStatus.PENDING,
        SUBMITTED: TaskStatus.RUNNING,
        SUCCEEDED: TaskStatus.SUCCEEDED,
        DONE: TaskStatus.SUCCEEDED,
        EXPIRED: TaskStatus.SUCCEEDED,
        FAILED: TaskStatus.FAILED,
    }[row.state]
    error = None
    if row.error_code is not None:
        error = {"code": row.error_code, "message": row.error_message or ""}
    return {
        "line": row.line,
        "id": row.caller_id,
        "task_id": row.task_id,
        "status": status.value,
        "files": row.files,
        "error": error,
    }


def _bad_record(bad: BadLine) -> dict[str, Any]:
    return {"line": bad.line, "id": None, "task_id": None, "status": "failed", "files": [],
            "error": {"code": "invalid_line", "message": bad.reason}}  # fmt: skip


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


def _retry_later(err: ImggwError) -> bool:
    """A failure after which a line is tried again later instead of failing: what the core
    retries, and an unknown submit outcome (the line's key makes another try safe)."""
    return isinstance(err, UnknownOutcomeError) or classify(err).retry


class _Run:
    def __init__(
        self,
        client: AsyncClient,
        ledger: Ledger,
        rows: list[Row],
        *,
        concurrency: int,
        deadline: float,
        on_progress: Callable[[BatchProgress], None] | None,
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.rows = rows
        self.deadline = deadline
        self.on_progress = on_progress
        self.submits = anyio.CapacityLimiter(concurrency)
        self.downloads = anyio.CapacityLimiter(concurrency)
        self.pause_until = 0.0
        self.fatal: ImggwError | None = None
        self.started = time.monotonic()
        self.finished_here = 0
        self.rng = random.Random()

    # ------------------------------------------------------------------------ progress

    def progress(self) -> BatchProgress:
        counts = Counter(row.state for row in self.rows)
        return BatchProgress(
            total=len(self.rows),
            counts=dict(counts),
            credits=sum(row.credits or 0 for row in self.rows),
            cost=round(sum(row.cost or 0 for row in self.rows), 6),
            elapsed=time.monotonic() - self.started,
            finished_this_run=self.finished_here,
        )

    def save(self, row: Row) -> None:
        self.ledger.save(row)
        if row.state in FINAL:
            self.finished_here += 1
        if self.on_progress is not None:
            self.on_progress(self.progress())

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    async def pause(self, attempt: int, hint: float | None = None) -> bool:
        """Sleeps before a retry (at least ``hint``); False once the deadline is too near."""
        delay = hint if hint is not None else min(RETRY_PAUSE[1], RETRY_PAUSE[0] * 2**attempt)
        delay = delay * self.rng.uniform(1.0, 1.25)
        if delay >= self.remaining():
            return False
        await anyio.sleep(delay)
        return True

    # ------------------------------------------------------------------------ per line

    async def line(self, row: Row) -> None:
        try:
            if row.state == PENDING:
                await self.submit(row)
            if row.state == SUBMITTED:
                await self.wait(row)
            if row.state == SUCCEEDED:
                await self.download(row)
        except FATAL as err:
            self.fatal = self.fatal or err

    async def submit(self, row: Row) -> None:
        request = row.request
        for attempt in itertools.count():
            if self.fatal is not None:
                return
            wait_for = self.pause_until - time.monotonic()
            if wait_for > 0:  # a 429 elsewhere slows every submit down
                if wait_for >= self.remaining():
                    return
                await anyio.sleep(wait_for)
            try:
                async with self.submits:
                    sub = await self.client.submit(
                        request["prompt"],
                        aspect_ratio=request["aspect_ratio"],
                        resolution=request["resolution"],
                        surface=row.surface,
                        idempotency_key=row.idempotency_key,
                    )
            except FATAL:
                raise
            except ImggwError as err:
                if not _retry_later(err):
                    self.fail(row, err.code or "refused", err.message)
                    return
                hint = getattr(err, "retry_after", None)
                if isinstance(err, RateLimitError):
                    pause = hint if hint is not None else 5.0
                    self.pause_until = max(self.pause_until, time.monotonic() + pause)
                if not await self.pause(attempt, hint):
                    return  # out of time: the line stays pending with its key
                continue
            row.task_id, row.state = sub.task_id, SUBMITTED
            self.save(row)
            return

    async def wait(self, row: Row) -> None:
        assert row.task_id is not None
        remaining = self.remaining()
        if remaining <= 0:
            return
        try:
            task = await self.client.wait(row.task_id, surface=row.surface, timeout=remaining)
        except WaitTimeoutError:
            return  # still running: a later run resumes the wait
        except TaskFailedError as err:
            self.bill(row, err.task)
            error = err.task.error
            self.fail(row, error.code if error else "failed", error.message if error else "")
            return
        except FATAL:
            raise
        except ImggwError as err:
            self.fail(row, err.code or "query_failed", err.message)
            return
        self.bill(row, task)
        row.urls, row.state = list(task.image_urls), SUCCEEDED
        self.save(row)

    def bill(self, row: Row, task: Task) -> None:
        row.credits, row.cost = task.credits, task.cost

    async def download(self, row: Row) -> None:
        assert row.task_id is not None
        task = Task(id=row.task_id, surface=check_surface(row.surface),
                    status=TaskStatus.SUCCEEDED, image_urls=row.urls)  # fmt: skip
        if not row.urls:
            self.fail(row, "no_result", f"task {row.task_id} succeeded without result URLs")
            return
        for attempt in itertools.count():
            try:
                async with self.downloads:
                    files = await self.client.download(task, self.ledger.folder, overwrite=True)
            except ResultExpiredError as err:
                row.state, row.error_code, row.error_message = (
                    EXPIRED,
                    "result_expired",
                    err.message,
                )
                self.save(row)
                return
            except ImggwError as err:
                if not (isinstance(err, DownloadError) or _retry_later(err)):
                    raise
                if not await self.pause(attempt):
                    return  # out of time: a later run downloads it
                continue
            row.files = [{"path": f.path.name, "sha256": f.sha256, "size": f.size} for f in files]
            row.state = DONE
            self.save(row)
            return

    def fail(self, row: Row, code: str, message: str) -> None:
        row.state, row.error_code, row.error_message = FAILED, code, message
        self.save(row)


def _sweep_partial_files(folder: Path) -> None:
    """Temp files of downloads cut short by a kill: we hold the folder's lock, so no live run
    owns them."""
    for leftover in folder.glob(".*.part"):
        leftover.unlink(missing_ok=True)


def _verify_files(folder: Path, rows: list[Row]) -> None:
    """Lines whose files are missing or corrupt go back to be downloaded again."""
    for row in rows:
        if row.state == DONE and not all(
            file_sha256(folder / f["path"]) == f["sha256"] for f in row.files
        ):
            row.state, row.files = SUCCEEDED, []


def write_manifest(folder: Path, rows: list[Row], bad: list[BadLine]) -> Path:
    records = [manifest_record(row) for row in rows] + [_bad_record(b) for b in bad]
    records.sort(key=lambda r: r["line"])
    path = folder / MANIFEST_NAME
    tmp = folder / f".{MANIFEST_NAME}.{os.getpid()}.part"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, path)
    return path


async def arun_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client: AsyncClient,
    concurrency: int = 8,
    timeout: float | None = None,
    surface: str | None = None,
    skip_bad_lines: bool = False,
    on_progress: Callable[[BatchProgress], None] | None = None,
) -> BatchReport:
    """Runs (or resumes) a batch: every line submitted once, waited on, downloaded, verified.

    ``source`` is a JSONL or text file, or an iterable of requests (``ImageRequest``, dicts
    with the JSONL fields, or prompts). Bad lines stop the run before anything is sent
    (:class:`BatchInputError`) unless ``skip_bad_lines``. ``timeout`` bounds the run; what is
    left unfinished is resumed by the next run with the same ``out_dir``.

    Example::

        async with AsyncClient() as client:
            report = await arun_batch("prompts.jsonl", "out/", client=client, concurrency=16)
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise RequestValidationError(
            "concurrency", "must be an integer >= 1", code="invalid_concurrency"
        )
    lines, bad = read_lines(source)
    if bad and not skip_bad_lines:
        raise BatchInputError(bad)
    folder = Path(out_dir)
    started = time.monotonic()
    budget = math.inf if timeout is None else float(timeout)
    with Ledger.open(folder) as ledger:
        rows, changed = ledger.plan(lines, surface or client.surface)
        _sweep_partial_files(folder)
        _verify_files(folder, rows)
        run = _Run(client, ledger, rows, concurrency=concurrency,
                   deadline=started + budget, on_progress=on_progress)  # fmt: skip
        if on_progress is not None:
            on_progress(run.progress())
        try:
            async with anyio.create_task_group() as group:
                for row in rows:
                    if row.state not in FINAL:
                        group.start_soon(run.line, row)
        finally:
            manifest = write_manifest(folder, rows, bad)
        if run.fatal is not None:
            raise run.fatal
        snapshot = run.progress()
    return BatchReport(
        rows=rows,
        bad_lines=bad,
        changed_lines=[line.line for line in changed],
        manifest=manifest,
        elapsed=time.monotonic() - started,
        counts=snapshot.counts,
        credits=snapshot.credits,
        cost=snapshot.cost,
    )


def run_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client_factory: Callable[[], AsyncClient] | None = None,
    concurrency: int = 8,
    timeout: float | None = None,
    surface: str | None = None,
    skip_bad_lines: bool = False,
    on_progress: Callable[[BatchProgress], None] | None = None,
    rate_limit: RateLimit | None = None,
) -> BatchReport:
    """The blocking form of :func:`arun_batch`. ``client_factory`` makes the AsyncClient to use
    (default: ``AsyncClient(rate_limit=rate_limit)`` from ``IMGGW_API_KEY`` /
    ``IMGGW_BASE_URL``); ``rate_limit`` is the request budget of that default client (give
    your factory's client its own).

    Example::

        report = run_batch("prompts.jsonl", "out/", concurrency=16, timeout=3600)
        sys.exit(report.exit_code)
    """
    if client_factory is not None and rate_limit is not None:
        raise RequestValidationError(
            "rate_limit", "give it to the client your client_factory makes", code="invalid_option"
        )

    def make() -> AsyncClient:
        if client_factory is not None:
            return client_factory()
        return AsyncClient(rate_limit=rate_limit)

    async def main() -> BatchReport:
        async with make() as client:
            return await arun_batch(
                source, out_dir, client=client, concurrency=concurrency, timeout=timeout,
                surface=surface, skip_bad_lines=skip_bad_lines, on_progress=on_progress,
            )  # fmt: skip

    return anyio.run(main)
