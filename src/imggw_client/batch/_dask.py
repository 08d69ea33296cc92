"""Sharded batches on Dask (``pip install 'imggw[dask]'``): a driver that cuts the input into
shards, one Dask task each, on an existing cluster or a local one it starts and stops.

Before anything is dispatched the driver checks the whole input (bad lines, repeated ids, lines
changed since the run began: refused unless allowed), makes the run's identity once, and puts
each shard's slice of the input in the output folder, where every worker can read it. Each
shard is one ``async def`` task on a worker's event loop, running the batch runner
(``_shards.arun_shard``) with an ``AsyncClient`` made there: the API key never travels in a
task; each worker reads ``IMGGW_API_KEY`` from its own environment.

Exactly once comes from the keys, not from the engine: Dask runs a task again when its worker
dies (and may rerun a finished one, dask/distributed#7870); a shard run again sends the same
keys and the gateway replays its tasks. A shard whose worker dies, or that raises, is run again
(a few times, with tenacity's backoff); the others go on; one that keeps failing is reported.

One request budget for the whole run (DESIGN 9): a scheduler plugin holds the pure ``Budget``
(a scheduler outlives any worker); every worker's client asks it for each request's slot and
tells it how each ended, so a 429 seen by any worker slows every worker.

Progress between shard completions is read from the output folder, as ``status()`` reads it:
each running shard's ledger (on a local folder) or its latest checkpoint (on a remote one), by
a thread of the driver's, every few seconds; a read that fails is tried again the next time.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import pickle
import re
import secrets
import shutil
import sqlite3
import tempfile
import time
from bisect import bisect_right
from collections.abc import Callable, Hashable
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from distributed import Client as DaskClient
from distributed import LocalCluster, get_worker
from distributed.diagnostics.plugin import SchedulerPlugin
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from .._async_client import AsyncClient
from .._config import PollPolicy, RateLimit, RetryPolicy, check_surface
from .._core.budget import DEFAULT_BACKOFF, Budget, Ticket
from .._exceptions import (
    AuthenticationError,
    ConfigurationError,
    ImggwError,
    InsufficientCreditsError,
    PermissionDeniedError,
    RequestValidationError,
)
from . import _identity
from ._input import BadLine, BatchInputError, count_lines
from ._ledger import DONE, EXPIRED, FAILED, LEDGER_NAME, SUBMITTED, SUCCEEDED
from ._runner import check_run_options
from ._shards import (
    CHECKPOINT_EVERY,
    SHARDS_DIR,
    MergeReport,
    Scan,
    ShardReport,
    ShardSpec,
    claim_identity,
    load_identity,
    merge,
    publish_lines,
    scan_input,
    scratch_folder,
    shard_name,
    shard_range,
    slice_name,
    write_slices,
)
from ._storage import Storage, open_storage

log = logging.getLogger("imggw_client")

PLUGIN_NAME = "imggw-budgets"
HANDLER = "imggw_budget"
DEFAULT_SHARD_SIZE = 1000
SHARD_RETRIES = 3  # a shard that fails is run this many more times before it is reported
TICKET_TTL = 900.0  # a slot neither used nor given back this long belonged to a dead worker
PROGRESS_EVERY = 2.0  # seconds between two readings of the run's progress
SHARD_KEY = "imggw-shard-"  # the driver's Dask keys: this, the shard's name, the run id's start
# Failures that no rerun of a shard can mend: the driver reports them at once.
RUN_FATAL = (
    AuthenticationError, PermissionDeniedError, InsufficientCreditsError, ConfigurationError,
    RequestValidationError,
)  # fmt: skip


# ---------------------------------------------------------------------------- the budget


class BudgetPlugin(SchedulerPlugin):
    """Request budgets on the scheduler, one per run (by run id), asked by every worker through
    the scheduler handler ``imggw_budget``. The logic is the pure :class:`Budget`'s, on the
    scheduler's clock; tickets live here, so a worker only holds their numbers.

    Example::

        await dask_client.register_plugin(BudgetPlugin(), name=PLUGIN_NAME)
    """

    idempotent = True  # registering it again (another run) keeps the budgets it holds
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.budgets: dict[str, Budget] = {}
        self.tickets: dict[int, tuple[str, Ticket, float]] = {}
        self.numbers = itertools.count(1)
        self.swept = 0.0

    async def start(self, scheduler: Any) -> None:
        scheduler.handlers[HANDLER] = self.handle

    def handle(
        self,
        budget: str,
        action: str,
        kind: str | None = None,
        ticket: int | None = None,
        limit: dict[str, float | None] | None = None,
        limited: bool = False,
        retry_after: float | None = None,
        backoff: tuple[float, float] | list[float] | None = None,
    ) -> dict[str, Any]:
        now = time.monotonic()
        self._sweep(now)
        if action == "open":
            if budget not in self.budgets:
                self.budgets[budget] = Budget(RateLimit(**(limit or {})))
            return {"ok": True}
        held = self.budgets.setdefault(budget, Budget(RateLimit()))
        if action == "reserve":
            assert kind is not None
            new = held.reserve(kind, now)
            number = next(self.numbers)
            self.tickets[number] = (budget, new, now)
            return {"ticket": number, "wait": held.wait_time(new, now)}
        found = self.tickets.get(ticket) if ticket is not None else None
        if found is None:  # swept, or the scheduler restarted: nothing to wait for
            return {"wait": 0.0}
        slot = found[1]
        if action == "wait":
            return {"wait": held.wait_time(slot, now)}
        del self.tickets[ticket]  # type: ignore[arg-type]
        if action == "release":
            held.release(slot)
        else:
            first, longest = backoff or DEFAULT_BACKOFF
            held.finished(slot, now, limited=limited, retry_after=retry_after,
                          backoff=(first, longest))  # fmt: skip
        return {"ok": True}

    def _sweep(self, now: float) -> None:
        if now - self.swept < 60.0:
            return
        self.swept = now
        for number, (budget, slot, since) in list(self.tickets.items()):
            if now - since > TICKET_TTL:
                del self.tickets[number]
                self.budgets[budget].release(slot)


class SchedulerBudget:
    """The budget a worker's client asks: the run's, on the scheduler (a ``BudgetService``)."""

    def __init__(self, budget: str) -> None:
        self.budget = budget
        self.scheduler = get_worker().scheduler

    async def _ask(self, **message: Any) -> dict[str, Any]:
        answer: dict[str, Any] = await getattr(self.scheduler, HANDLER)(
            budget=self.budget, **message
        )
        return answer

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        answer = await self._ask(action="reserve", kind=kind)
        return answer["ticket"], float(answer["wait"])

    async def wait_time(self, ticket: Hashable) -> float:
        return float((await self._ask(action="wait", ticket=ticket))["wait"])

    async def release(self, ticket: Hashable) -> None:
        await self._ask(action="release", ticket=ticket)

    async def finished(
        self,
        ticket: Hashable,
        *,
        limited: bool,
        retry_after: float | None,
        backoff: tuple[float, float],
    ) -> None:
        await self._ask(action="finished", ticket=ticket, limited=limited, retry_after=retry_after,
                        backoff=list(backoff))  # fmt: skip


# ---------------------------------------------------------------------------- one shard task


@dataclass(frozen=True)
class ClientSpec:
    """How a worker makes its client: everything but the API key, which each worker reads
    from its own ``IMGGW_API_KEY`` (a task's arguments are kept by the scheduler and may be
    shown in its dashboard; a key has no place there).

    Example::

        spec = ClientSpec(base_url="https://gateway.example", surface="beta")
    """

    base_url: str | None = None
    surface: str = "beta"
    timeout: float = 30.0
    retry: RetryPolicy | None = None
    poll: PollPolicy | None = None

    def make(self) -> AsyncClient:
        options: dict[str, Any] = {"base_url": self.base_url, "surface": self.surface,
                                   "timeout": self.timeout, "retry": self.retry}  # fmt: skip
        if self.poll is not None:
            options["poll"] = self.poll
        return AsyncClient(**options)


class ShardError(ImggwError):
    """A shard's failure as its worker reported it, when the error itself could not travel.

    Example::

        except ShardError as err:
            print(err.kind, err.message)
    """

    def __init__(self, message: str, *, kind: str = "", code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.kind = kind

    def __reduce__(self) -> Any:
        return (_shard_error, (self.message, self.kind, self.code))


def _shard_error(message: str, kind: str, code: str | None) -> ShardError:
    return ShardError(message, kind=kind, code=code)


class InjectedFault(RuntimeError):
    """A test's or benchmark's fault: the shard raises after some lines (first try only)."""


@dataclass
class _Failed:
    error: ImggwError
    fatal: bool


def _portable(err: ImggwError) -> ImggwError:
    """The error itself if it survives pickling, else a ShardError with its message."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return ShardError(err.message, kind=type(err).__name__, code=err.code)
    return err


async def run_shard_task(
    spec: ShardSpec,
    client: ClientSpec,
    budget: str | None,
    attempt: int,
    crash_after: int | None = None,
) -> ShardReport | _Failed:
    """The Dask task of one shard, on a worker's event loop."""
    from ._shards import arun_shard

    def fault(progress: Any) -> None:
        if progress.finished_this_run >= (crash_after or 0):
            raise InjectedFault(f"injected fault in shard {spec.name}")

    on_progress = fault if crash_after is not None and attempt == 1 else None
    async with client.make() as made:
        if budget is not None:
            made._use_budget(SchedulerBudget(budget))
        try:
            return await arun_shard(spec, client=made, on_progress=on_progress)
        except ImggwError as err:
            return _Failed(_portable(err), isinstance(err, RUN_FATAL))


# ---------------------------------------------------------------------------- the driver


@dataclass
class ShardOutcome:
    """How one shard ended: its report, or the error that ended its last try."""

    index: int
    count: int
    lines: range
    attempts: int
    report: ShardReport | None = None
    error: BaseException | None = None

    @property
    def name(self) -> str:
        return shard_name(self.index, self.count)


@dataclass
class ShardedReport:
    """What a sharded run did: each shard's outcome, the merged manifest, and the exit code as
    ``imggw batch`` gives it (0 all succeeded, 1 some failed, 3 some unfinished: run the same
    command again to resume). ``startup`` is the seconds the engine took to be ready;
    ``retried`` how many shard tries failed and ran again.

    Example::

        report = run_sharded("prompts.jsonl", "s3://bucket/run", workers=4)
        print(report.merged.counts, report.failed_shards)
    """

    shards: list[ShardOutcome]
    merged: MergeReport
    elapsed: float
    startup: float
    changed_lines: list[int] = field(default_factory=list)
    changed_count: int = 0
    bad_count: int = 0

    @property
    def failed_shards(self) -> list[ShardOutcome]:
        return [s for s in self.shards if s.report is None]

    @property
    def retried(self) -> int:
        return sum(s.attempts - 1 for s in self.shards)

    @property
    def exit_code(self) -> int:
        return 3 if self.failed_shards else self.merged.exit_code


class _ShardCrashed(Exception):
    """A try of a shard that ended without a report: its worker died, or it raised."""


@dataclass
class _Prepared:
    run: _identity.RunIdentity
    total: int
    count: int
    scan: Scan
    first_entries: list[int]
    entries: list[int] = field(default_factory=list)  # each shard's, when progress is read


# ---------------------------------------------------------------------------- progress


@dataclass(frozen=True)
class ShardedProgress:
    """How far a sharded run has come across every shard, as last read from its output folder:
    ``total`` lines (bad input lines apart, in ``bad``), ``counts`` per state as :func:`status`
    names them (pending, running, succeeded, failed), the shards that ended in this run,
    seconds since dispatch began and lines finished per second since the first reading.

    Example::

        def show(p: ShardedProgress) -> None:
            print(f"{p.finished}/{p.total} lines, {p.shards_ended}/{p.shards} shards ended")

        run_sharded("prompts.jsonl", "out/", workers=4, on_progress=show)
    """

    total: int
    counts: dict[str, int]
    bad: int
    shards: int
    shards_ended: int
    elapsed: float
    throughput: float

    @property
    def finished(self) -> int:
        """Lines that are done with: succeeded (saved) or failed."""
        return self.counts["succeeded"] + self.counts["failed"]


# A ledger's rows in the states of status(), ranked as it ranks a line's record: files saved,
# then a failure or an error, then a task on its way.
_COUNTS = f"""
SELECT CASE
    WHEN kind = 'bad' THEN 'bad'
    WHEN state IN ('{DONE}', '{SUCCEEDED}', '{EXPIRED}') AND files NOT IN ('', '[]')
        THEN 'succeeded'
    WHEN state = '{FAILED}' OR error_code IS NOT NULL THEN 'failed'
    WHEN state IN ('{SUBMITTED}', '{SUCCEEDED}') THEN 'running'
    ELSE 'pending'
END, COUNT(*) FROM lines WHERE planned = ? GROUP BY 1
"""


class _ProgressReader:
    """Lines per state of every shard, read from the output folder. Blocking: it runs in a
    thread. A shard is read once before it runs (a resumed run's shards did some already),
    while it runs (the scheduler says which do) and once after it ended; on a remote folder,
    no sooner than a new checkpoint can be there. A shard that cannot be read now keeps what
    was read before, and is read again the next time."""

    def __init__(self, storage: Storage, names: list[str], entries: list[int], bad: int,
                 *, checkpoint_every: float) -> None:  # fmt: skip
        self.storage = storage
        self.names = names
        self.total = max(0, sum(entries) - bad)
        self.bad = bad
        self.every = 0.0 if storage.local is not None else checkpoint_every
        self.counts: dict[str, dict[str, int]] = {}
        self.read_at: dict[str, float] = {}
        self.final: set[str] = set()
        self.first: tuple[float, int] | None = None

    def read(self, running: set[str] | None, ended: set[str], elapsed: float) -> ShardedProgress:
        """Reads the shards due (``running``: those on a worker now, None if unknown; ``ended``:
        those that ended in this run) and returns the run's progress."""
        now = time.monotonic()
        remote = self.storage.local is None
        with tempfile.TemporaryDirectory(prefix="imggw-") if remote else nullcontext() as tmp:
            for name in self.names:
                if not self._due(name, running, ended, now):
                    continue
                try:
                    found = self._shard(name, None if tmp is None else Path(tmp))
                except Exception as exc:  # a file being replaced, a store that failed a GET
                    log.debug("progress of shard %s not read now: %r", name, exc)
                    continue
                self.read_at[name] = now
                if found is not None:
                    self.counts[name] = found
                if name in ended:
                    self.final.add(name)
        return self._snapshot(len(ended), elapsed)

    def _due(self, name: str, running: set[str] | None, ended: set[str], now: float) -> bool:
        if name in self.final:
            return False
        last = self.read_at.get(name)
        if last is None or name in ended:  # its state before it runs; its last state
            return True
        if running is not None and name not in running:  # waiting: nothing changes
            return False
        return now - last >= self.every

    def _shard(self, name: str, tmp: Path | None) -> dict[str, int] | None:
        rel = f"{SHARDS_DIR}/{name}/{LEDGER_NAME}"
        local = self.storage.local
        if local is not None:
            path = (local / rel).resolve()
            if not path.exists():
                return None
        else:
            assert tmp is not None
            path = tmp / f"{name}.sqlite"
            if not self.storage.get(rel, path):
                return None
        # Read only: a live shard (another process) is writing it.
        with closing(sqlite3.connect(path.as_uri() + "?mode=ro", uri=True, timeout=1.0)) as db:
            plan = db.execute("SELECT value FROM meta WHERE key='plan'").fetchone()
            if plan is None:
                return {}
            return dict(db.execute(_COUNTS, (int(plan[0]),)).fetchall())

    def _snapshot(self, ended: int, elapsed: float) -> ShardedProgress:
        seen = {"running": 0, "succeeded": 0, "failed": 0}
        for counts in self.counts.values():
            for state in seen:
                seen[state] += counts.get(state, 0)
        # Lines no ledger speaks of yet are pending, as in status().
        counts = {"pending": max(0, self.total - sum(seen.values())), **seen}
        finished = seen["succeeded"] + seen["failed"]
        if self.first is None:
            self.first = (elapsed, finished)
        took = elapsed - self.first[0]
        throughput = (finished - self.first[1]) / took if took > 0 else 0.0
        return ShardedProgress(
            total=self.total, counts=counts, bad=self.bad, shards=len(self.names),
            shards_ended=ended, elapsed=elapsed, throughput=max(0.0, throughput),
        )  # fmt: skip


def _entries(source: str, count: int, total: int) -> list[int]:
    """Each shard's entries (lines neither blank nor comments), counted as ``write_slices``
    counts them. Blocking."""
    found = [0] * count
    starts = [shard_range(i, count, total).start for i in range(1, count + 1)]
    with Path(source).open(encoding="utf-8-sig", newline="") as handle:
        for number, raw in enumerate(handle, 1):
            stripped = raw.strip()
            if stripped and not stripped.startswith("#"):
                found[bisect_right(starts, number) - 1] += 1
    return found


async def _running(dask: DaskClient, run_id: str) -> set[str] | None:
    """The run's shards the scheduler has on a worker now, or None if it cannot tell."""
    pattern = re.compile(re.escape(SHARD_KEY) + r"(\d{4,}-of-\d{4,})-" + re.escape(run_id[:8]))
    try:
        processing = await dask.processing()  # type: ignore[no-untyped-call]
    except Exception as exc:  # a scheduler busy or gone: every shard is read instead
        log.debug("running shards not known now: %r", exc)
        return None
    return {
        match[1]
        for keys in processing.values()
        for key in keys
        if isinstance(key, str) and (match := pattern.match(key))
    }


async def _watch(
    dask: DaskClient,
    reader: _ProgressReader,
    outcomes: list[ShardOutcome],
    run_id: str,
    began: float,
    every: float,
    on_progress: Callable[[ShardedProgress], None],
) -> None:
    """Reads the run's progress every ``every`` seconds, off the event loop, until cancelled;
    the next reading starts ``every`` seconds after the last one ended, so a slow store slows
    the readings, never the run."""
    while True:
        running = await _running(dask, run_id)
        ended = {o.name for o in outcomes if o.report is not None or o.error is not None}
        elapsed = time.monotonic() - began
        try:
            # Abandoned, not awaited, when the run ends: a stalled read cannot hold it up.
            progress = await anyio.to_thread.run_sync(
                reader.read, running, ended, elapsed, abandon_on_cancel=True
            )
        except Exception as exc:
            log.debug("progress not read now: %r", exc)
        else:
            on_progress(progress)
        await anyio.sleep(every)


def _prepare(
    source: str,
    storage: Storage,
    work: Path,
    *,
    surface: str,
    shard_size: int,
    skip_bad_lines: bool,
    allow_changes: bool,
    entries: bool = False,
) -> _Prepared:
    """The whole input checked and the run's identity made, before any shard is dispatched;
    then each shard's slice put in the output folder (and, with ``entries``, how many entries
    each has). Blocking. All of it reads one copy of the input: a file edited meanwhile must not
    slip an unchecked line into a slice."""
    copy = work / "input" / Path(source).name
    try:
        copy.parent.mkdir()
        shutil.copyfile(source, copy)
    except OSError as exc:
        raise RequestValidationError("source", f"cannot read {source}: {exc}") from exc
    source = str(copy)
    total = count_lines(source)
    for _ in range(2):  # a second time only if a shard process made the run meanwhile
        local = storage.local
        record = local / _identity.LINES_NAME if local is not None else work / "run.lines.fp"
        if local is None and not storage.get(_identity.LINES_NAME, record):
            record.unlink(missing_ok=True)
        scan = scan_input(source, work, surface=surface, old=record)
        try:
            if scan.bad_count and not skip_bad_lines:
                bad = [BadLine(line, reason) for line, reason in scan.bad]
                raise BatchInputError(bad, scan.bad_count)
            digests = scan.digests
            if digests.changed_count and not allow_changes:
                raise _identity.InputChangedError(digests.changed, digests.changed_count)
            run = load_identity(storage)
            if run is None:
                run, created = claim_identity(storage, scan)
                if not created and run.input_fingerprint != scan.fingerprint:
                    continue  # compare again, with the record its maker published
            elif run.input_fingerprint != scan.fingerprint:  # changes, allowed
                publish_lines(storage, digests)
                run = _identity.RunIdentity(run.run_id, scan.fingerprint)
                storage.write(_identity.RUN_NAME, _identity.record_bytes(run))
            count = max(1, math.ceil(total / shard_size))
            first_entries = write_slices(source, storage, count, total, work)
            per_shard = _entries(source, count, total) if entries else []
            return _Prepared(run, total, count, scan, first_entries, per_shard)
        finally:
            scan.digests.discard()
    raise ConfigurationError(  # pragma: no cover - two runs racing twice on a fresh folder
        f"another run with another input began in {storage.url} at the same moment"
    )


async def arun_sharded(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    address: str | None = None,
    workers: int | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    client: ClientSpec | None = None,
    rate_limit: RateLimit | None = None,
    concurrency: int = 8,
    timeout: float | None = None,
    skip_bad_lines: bool = False,
    allow_changes: bool = False,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    scratch: str | os.PathLike[str] | None = None,
    shard_retries: int = SHARD_RETRIES,
    checkpoint_every: float = CHECKPOINT_EVERY,
    on_shard: Callable[[ShardOutcome], None] | None = None,
    on_progress: Callable[[ShardedProgress], None] | None = None,
    progress_every: float = PROGRESS_EVERY,
    cluster_options: dict[str, Any] | None = None,
    faults: dict[int, int] | None = None,
) -> ShardedReport:
    """Runs (or resumes) a batch as shards of ``shard_size`` lines on Dask: on the cluster at
    ``address``, or on a local cluster of ``workers`` processes started and stopped here. See
    :func:`run_sharded`. ``faults`` (tests, benchmarks) makes shard ``i``'s first try raise
    after ``faults[i]`` lines."""
    if (address is None) == (workers is None):
        raise RequestValidationError(
            "engine", "give the cluster's address or a number of workers (one of them)",
            code="invalid_option",
        )  # fmt: skip
    counts = {"shard_size": (shard_size, 1), "shard_retries": (shard_retries, 0)}
    if workers is not None:
        counts["workers"] = (workers, 1)
    for name, (value, least) in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise RequestValidationError(name, f"must be an integer >= {least}")
    for name, seconds in {"checkpoint_every": checkpoint_every,
                          "progress_every": progress_every}.items():  # fmt: skip
        number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not number or not 0 < seconds < math.inf:
            raise RequestValidationError(name, "must be a number of seconds > 0")
    check_run_options(concurrency, timeout)
    source = os.fspath(source)
    if source == "-" or not Path(source).is_file():
        raise RequestValidationError(
            "source", f"{source} must be a file: shards are cut from a file read twice"
        )
    dest = os.fspath(dest)
    spec = client or ClientSpec()
    surface = check_surface(spec.surface)
    started = time.monotonic()
    storage = open_storage(dest, storage_options)
    work = scratch_folder(storage.url, scratch) / f"driver-{secrets.token_hex(4)}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        prepared = await anyio.to_thread.run_sync(
            lambda: _prepare(source, storage, work, surface=surface, shard_size=shard_size,
                             skip_bad_lines=skip_bad_lines, allow_changes=allow_changes,
                             entries=on_progress is not None)
        )  # fmt: skip
    finally:
        await anyio.to_thread.run_sync(lambda: _rmtree(work))
    progress = None
    if on_progress is not None:
        names = [shard_name(i, prepared.count) for i in range(1, prepared.count + 1)]
        reader = _ProgressReader(storage, names, prepared.entries, prepared.scan.bad_count,
                                 checkpoint_every=checkpoint_every)  # fmt: skip
        progress = (reader, progress_every, on_progress)
    outcomes = await _dispatch(
        prepared, source, dest, spec, address=address, workers=workers, rate_limit=rate_limit,
        options={
            "storage_options": dict(storage_options or {}), "concurrency": concurrency,
            "timeout": timeout, "surface": surface, "skip_bad_lines": skip_bad_lines,
            "verify": verify, "scratch": None if scratch is None else os.fspath(scratch),
            "checkpoint_every": checkpoint_every,
        },
        shard_retries=shard_retries, on_shard=on_shard, cluster_options=cluster_options or {},
        faults=faults or {},
        progress=progress,
    )  # fmt: skip
    shards, startup = outcomes
    for outcome in shards:  # a failure no rerun can mend ends the run as it would one process
        if outcome.report is None and isinstance(outcome.error, RUN_FATAL):
            raise outcome.error
    merged = await anyio.to_thread.run_sync(lambda: merge(dest, storage_options=storage_options))
    digests = prepared.scan.digests
    return ShardedReport(
        shards=shards, merged=merged, elapsed=time.monotonic() - started, startup=startup,
        changed_lines=digests.changed, changed_count=digests.changed_count,
        bad_count=prepared.scan.bad_count,
    )  # fmt: skip


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


async def _dispatch(
    prepared: _Prepared,
    source: str,
    dest: str,
    client: ClientSpec,
    *,
    address: str | None,
    workers: int | None,
    rate_limit: RateLimit | None,
    options: dict[str, Any],
    shard_retries: int,
    on_shard: Callable[[ShardOutcome], None] | None,
    cluster_options: dict[str, Any],
    faults: dict[int, int],
    progress: tuple[_ProgressReader, float, Callable[[ShardedProgress], None]] | None = None,
) -> tuple[list[ShardOutcome], float]:
    began = time.monotonic()
    cluster: LocalCluster | None = None
    if workers is not None:
        # Loopback only, and a free port: its HTTP endpoints (and the dashboard, with bokeh)
        # are for this machine, and a second cluster never fights the first for port 8787.
        settings = {"n_workers": workers, "threads_per_worker": 1, "processes": True,
                    "dashboard_address": "127.0.0.1:0", "host": "127.0.0.1"}  # fmt: skip
        cluster = await LocalCluster(  # type: ignore[no-untyped-call]
            asynchronous=True, **{**settings, **cluster_options}
        )
    try:
        connect = DaskClient(cluster or address, asynchronous=True)  # type: ignore[no-untyped-call]
        async with connect as dask:
            limit = rate_limit or RateLimit()
            await dask.register_plugin(BudgetPlugin(), name=PLUGIN_NAME)
            run_id = prepared.run.run_id
            await getattr(dask.scheduler, HANDLER)(
                budget=run_id, action="open",
                limit={"submits_per_second": limit.submits_per_second,
                       "queries_per_second": limit.queries_per_second},
            )  # fmt: skip
            startup = time.monotonic() - began
            count = prepared.count
            name = slice_name(source)
            outcomes = [
                ShardOutcome(i, count, shard_range(i, count, prepared.total), 0)
                for i in range(1, count + 1)
            ]

            async def one(outcome: ShardOutcome) -> None:
                spec = ShardSpec(
                    source=f"{SHARDS_DIR}/{outcome.name}/{name}", dest=dest, index=outcome.index,
                    count=count, sliced=True, lines=outcome.lines, allow_changes=True,
                    first_entry=prepared.first_entries[outcome.index - 1], **options,
                )  # fmt: skip
                try:
                    outcome.report = await _run_with_retries(
                        dask, outcome, spec, client, run_id, shard_retries,
                        faults.get(outcome.index),
                    )  # fmt: skip
                except _ShardCrashed as crash:
                    outcome.error = crash.__cause__ or crash
                except ImggwError as err:
                    outcome.error = err
                if on_shard is not None:
                    on_shard(outcome)

            async with anyio.create_task_group() as watching:
                if progress is not None:
                    reader, every, on_progress = progress
                    watching.start_soon(_watch, dask, reader, outcomes, run_id, time.monotonic(),
                                        every, on_progress)  # fmt: skip
                async with anyio.create_task_group() as group:
                    for outcome in outcomes:
                        group.start_soon(one, outcome)
                watching.cancel_scope.cancel()
    finally:
        if cluster is not None:
            await cluster.close()  # type: ignore[misc]  # awaitable when asynchronous
    return outcomes, startup


async def _run_with_retries(
    dask: DaskClient,
    outcome: ShardOutcome,
    spec: ShardSpec,
    client: ClientSpec,
    budget: str,
    retries: int,
    crash_after: int | None,
) -> ShardReport:
    """One shard, tried again (tenacity: a few times, backing off) when its try ends without
    a report; a failure no rerun can mend is raised at once."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(_ShardCrashed),
        wait=wait_random_exponential(multiplier=0.5, max=10.0),
        stop=stop_after_attempt(retries + 1),
        reraise=True,
    ):
        with attempt:
            outcome.attempts += 1
            key = f"{SHARD_KEY}{spec.name}-{budget[:8]}-{outcome.attempts}-{secrets.token_hex(3)}"
            future = dask.submit(run_shard_task, spec, client, budget, outcome.attempts,
                                 crash_after, key=key, pure=False)  # fmt: skip
            try:
                result: Any = await future
            except Exception as exc:  # the worker died (KilledWorker), or the task raised
                raise _ShardCrashed(f"shard {spec.name}: {exc!r}") from exc
            finally:
                future.release()  # type: ignore[no-untyped-call]  # a result no one holds
                # cannot be rerun when its worker dies later (dask/distributed#7870)
            if isinstance(result, _Failed):
                if result.fatal:
                    raise result.error
                raise _ShardCrashed(f"shard {spec.name}: {result.error.message}") from result.error
            assert isinstance(result, ShardReport)
            return result
    raise AssertionError("unreachable")  # pragma: no cover


def run_sharded(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    address: str | None = None,
    workers: int | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    client: ClientSpec | None = None,
    rate_limit: RateLimit | None = None,
    concurrency: int = 8,
    timeout: float | None = None,
    skip_bad_lines: bool = False,
    allow_changes: bool = False,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    scratch: str | os.PathLike[str] | None = None,
    shard_retries: int = SHARD_RETRIES,
    checkpoint_every: float = CHECKPOINT_EVERY,
    on_shard: Callable[[ShardOutcome], None] | None = None,
    on_progress: Callable[[ShardedProgress], None] | None = None,
    progress_every: float = PROGRESS_EVERY,
    cluster_options: dict[str, Any] | None = None,
    faults: dict[int, int] | None = None,
) -> ShardedReport:
    """Runs (or resumes) a batch as shards on Dask, into ``dest`` (a folder or an fsspec URL
    every worker reaches), then merges ``DEST/manifest.jsonl`` and ``index.html``.

    ``address`` is a running scheduler (``tcp://host:8786``); ``workers`` starts a local cluster
    of that many processes for this run and stops it after. Each shard is ``shard_size`` lines
    run by the batch runner with ``concurrency`` submits at once; ``rate_limit`` is one budget
    for the whole run, held by the scheduler. ``client`` says how workers reach the gateway
    (default: their ``IMGGW_BASE_URL``); the key is read from each worker's ``IMGGW_API_KEY``.
    The scheduler and workers need imggw installed. Bad or changed input is refused before
    anything is dispatched (``skip_bad_lines``, ``allow_changes``), as in :func:`run_batch`.
    A shard that fails is run again up to ``shard_retries`` times; a remote folder's shards
    checkpoint their ledgers every ``checkpoint_every`` seconds. ``on_shard`` is called as each
    shard ends; ``on_progress`` every ``progress_every`` seconds with a :class:`ShardedProgress`,
    lines per state across every shard as the output folder holds them (the running shards'
    ledgers; on a remote folder, their latest checkpoints), read by a thread of its own: a
    reading that fails is skipped, and the run never waits for one. Both are called on the
    event loop; what they raise ends the run, as an interruption does. ``cluster_options`` go
    to the local cluster (``workers``); ``faults`` (tests, benchmarks) makes shard ``i``'s
    first try raise after ``faults[i]`` lines.

    Example::

        report = run_sharded("prompts.jsonl", "s3://bucket/run", address="tcp://10.0.0.5:8786",
                             shard_size=5000, rate_limit=RateLimit(submits_per_second=20))
        sys.exit(report.exit_code)
    """
    return anyio.run(
        lambda: arun_sharded(
            source, dest, address=address, workers=workers, shard_size=shard_size,
            client=client, rate_limit=rate_limit, concurrency=concurrency, timeout=timeout,
            skip_bad_lines=skip_bad_lines, allow_changes=allow_changes, verify=verify,
            storage_options=storage_options, scratch=scratch, shard_retries=shard_retries,
            checkpoint_every=checkpoint_every, on_shard=on_shard, on_progress=on_progress,
            progress_every=progress_every, cluster_options=cluster_options, faults=faults,
        )
    )  # fmt: skip
