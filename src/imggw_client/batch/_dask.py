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
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
import secrets
import shutil
import time
from collections.abc import Callable, Hashable
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

PLUGIN_NAME = "imggw-budgets"
HANDLER = "imggw_budget"
DEFAULT_SHARD_SIZE = 1000
SHARD_RETRIES = 3  # a shard that fails is run this many more times before it is reported
TICKET_TTL = 900.0  # a slot neither used nor given back this long belonged to a dead worker
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


def _prepare(
    source: str,
    storage: Storage,
    work: Path,
    *,
    surface: str,
    shard_size: int,
    skip_bad_lines: bool,
    allow_changes: bool,
) -> _Prepared:
    """The whole input checked and the run's identity made, before any shard is dispatched;
    then each shard's slice put in the output folder. Blocking. All of it reads one copy of
    the input: a file edited meanwhile must not slip an unchecked line into a slice."""
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
            return _Prepared(run, total, count, scan, first_entries)
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
    every = checkpoint_every
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not 0 < every < math.inf:
        raise RequestValidationError("checkpoint_every", "must be a number of seconds > 0")
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
                             skip_bad_lines=skip_bad_lines, allow_changes=allow_changes)
        )  # fmt: skip
    finally:
        await anyio.to_thread.run_sync(lambda: _rmtree(work))
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

            async with anyio.create_task_group() as group:
                for outcome in outcomes:
                    group.start_soon(one, outcome)
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
            key = f"imggw-shard-{spec.name}-{budget[:8]}-{outcome.attempts}-{secrets.token_hex(3)}"
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
    checkpoint their ledgers every ``checkpoint_every`` seconds. ``cluster_options`` go to the
    local cluster (``workers``); ``faults`` (tests, benchmarks) makes shard ``i``'s first try
    raise after ``faults[i]`` lines.

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
            checkpoint_every=checkpoint_every, on_shard=on_shard,
            cluster_options=cluster_options, faults=faults,
        )
    )  # fmt: skip
