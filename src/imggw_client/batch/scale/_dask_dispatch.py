"""The shards of a Dask run on its cluster (``_dask`` is the driver that prepares them): each
shard one ``async def`` task on a worker's event loop, running the loop
(``_shards.arun_shard``) with an ``AsyncClient`` made there from a :class:`ClientSpec` (the API
key never travels in a task: each worker reads ``IMGGW_API_KEY`` from its own environment).

A shard whose worker dies, or that raises, is run again (a few times, with tenacity's backoff:
its keys make that safe); the others go on; one that keeps failing is reported, and a failure
no rerun can mend (:data:`RUN_FATAL`) is raised at once. The run's request budget and guards
are opened on the scheduler (``_dask_budget``) before the first shard goes.
"""

from __future__ import annotations

import logging
import pickle
import secrets
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import anyio
from distributed import Client as DaskClient
from distributed import LocalCluster
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from ..._async_client import AsyncClient
from ..._core.budget_service import BudgetService, Ended
from ..._core.config import PollPolicy, RateLimit, RetryPolicy
from ..._core.exceptions import (
    AuthenticationError,
    ConfigurationError,
    ImggwError,
    InsufficientCreditsError,
    PermissionDeniedError,
    RequestValidationError,
)
from .. import _identity
from .._admission import Charge
from .._plan import Scan
from ._dask_budget import (
    GUARD_HANDLER,
    HANDLER,
    PLUGIN_NAME,
    TICKET_TTL,
    BudgetPlugin,
    SchedulerBudget,
    scheduler_guard,
)
from ._dask_progress import SHARD_KEY, ProgressReader, ShardedProgress
from ._dask_progress import watch as watch_progress
from ._shards import ShardReport, ShardSpec, shard_folder, shard_name, shard_range

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RUN_FATAL", "ClientSpec", "HeldTickets", "Prepared", "ShardError", "ShardOutcome"]

log = logging.getLogger("imggw_client")

# Failures that no rerun of a shard can mend: the driver reports them at once.
RUN_FATAL = (
    AuthenticationError,
    PermissionDeniedError,
    InsufficientCreditsError,
    ConfigurationError,
    RequestValidationError,
)


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
    # Set by the driver when the run's RateLimit names a store (DESIGN 16): each worker's
    # client then shares the store's budget, not the scheduler's.
    rate_limit: RateLimit | None = None

    def make(self) -> AsyncClient:
        options: dict[str, Any] = {
            "base_url": self.base_url,
            "surface": self.surface,
            "timeout": self.timeout,
            "retry": self.retry,
            "rate_limit": self.rate_limit,
        }
        if self.poll is not None:
            options["poll"] = self.poll
        return AsyncClient(**options)


class ShardError(ImggwError):
    """A shard's failure as its worker reported it, when the error itself could not travel."""

    def __init__(self, message: str, *, kind: str = "", code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.kind = kind

    def __reduce__(self) -> Any:
        return (_shard_error, (self.message, self.kind, self.code))


def _shard_error(message: str, kind: str, code: str | None) -> ShardError:
    return ShardError(message, kind=kind, code=code)


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


class HeldTickets:
    """The run's budget on the scheduler as one try of a shard asks it, with the tickets the try
    holds. A request cancelled while it holds one (a try that raises cancels all its requests)
    never tells the scheduler it ended, and its place would count as in flight until
    ``TICKET_TTL`` (900 s): enough of them stall every worker. So a ticket is recorded as soon
    as it is handed out, and the try gives back those it still holds when it ends."""

    def __init__(self, service: BudgetService) -> None:
        self.service = service
        self.held: set[Hashable] = set()

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        # Shielded: a cancel here would lose the number of a ticket the scheduler handed out
        # (it holds a question at most HOLD, 1 s). The cancel comes at the next await.
        with anyio.CancelScope(shield=True):
            ticket, wait = await self.service.reserve(kind)
            self.held.add(ticket)
        return ticket, wait

    async def wait_time(self, ticket: Hashable) -> float:
        return await self.service.wait_time(ticket)

    async def release(self, ticket: Hashable) -> None:
        self.held.discard(ticket)
        await self.service.release(ticket)

    async def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        self.held.discard(ticket)
        await self.service.finished(ticket, **ended)

    async def give_back(self) -> None:
        """Releases every ticket still held (the try's requests have all ended). A scheduler
        that cannot be asked is noted, never raised: the shard's own outcome is the one to
        tell, and ``TICKET_TTL`` frees what is left."""
        with anyio.CancelScope(shield=True):
            while self.held:
                try:
                    await self.service.release(self.held.pop())
                except Exception as exc:
                    log.warning(
                        "a shard's budget slot was not given back (%s): the scheduler frees "
                        "it in %.0f s",
                        type(exc).__name__,
                        TICKET_TTL,
                    )


async def _shard_task(spec: ShardSpec, client: ClientSpec, budget: str) -> ShardReport | _Failed:
    """The Dask task of one shard, on a worker's event loop."""
    from ._shards import arun_shard

    async with client.make() as made:
        held: HeldTickets | None = None
        if client.rate_limit is None or client.rate_limit.store is None:
            held = HeldTickets(SchedulerBudget(budget))
            made.share_budget(held)
        try:
            return await arun_shard(spec, client=made, guard=scheduler_guard(budget))
        except ImggwError as err:
            return _Failed(_portable(err), isinstance(err, RUN_FATAL))
        finally:
            if held is not None:
                await held.give_back()


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

    @property
    def ended(self) -> bool:
        return self.report is not None or self.error is not None


class _ShardCrashed(Exception):
    """A try of a shard that ended without a report: its worker died, or it raised."""


@dataclass
class Prepared:
    """What the driver made ready before dispatch: the run's identity, the input's line count,
    how many shards, the scan of the whole input, and each shard's first entry number (and,
    when progress is read, how many entries each has)."""

    run: _identity.RunIdentity
    total: int
    count: int
    scan: Scan
    first_entries: list[int]
    entries: list[int] = field(default_factory=list)


class Dispatch:
    """The shards of one run on a cluster: each a Dask task, tried again when it ends without a
    report, under one budget held by the scheduler.
    """

    def __init__(
        self,
        prepared: Prepared,
        slice_file: str,
        template: ShardSpec,
        client: ClientSpec,
        retries: int,
        on_shard: Callable[[ShardOutcome], None] | None,
    ) -> None:
        self.prepared, self.slice_file, self.template = prepared, slice_file, template
        self.client, self.retries, self.on_shard = client, retries, on_shard
        self.charged: tuple[Charge, dict[str, Charge]] = (Charge(), {})
        self.stopped_by: str | None = None  # the guard that stopped the run's submits, if one
        self.stop_reason = ""
        count = prepared.count
        self.outcomes = [
            ShardOutcome(i, count, shard_range(i, count, prepared.total), 0)
            for i in range(1, count + 1)
        ]

    async def run(
        self,
        address: str | None,
        workers: int | None,
        rate_limit: RateLimit | None,
        cluster_options: dict[str, Any],
        progress: tuple[ProgressReader, float, Callable[[ShardedProgress], None]] | None,
    ) -> float:
        """Runs every shard; returns the seconds the engine took to be ready."""
        began = time.monotonic()
        cluster: LocalCluster | None = None
        if workers is not None:
            # Loopback only, and a free port: its HTTP endpoints (and the dashboard, with
            # bokeh) are for this machine, and a second cluster never fights for port 8787.
            settings = {
                "n_workers": workers,
                "threads_per_worker": 1,
                "processes": True,
                "dashboard_address": "127.0.0.1:0",
                "host": "127.0.0.1",
            }
            cluster = await LocalCluster(  # type: ignore[no-untyped-call]
                asynchronous=True, **{**settings, **cluster_options}
            )
        try:
            connect = DaskClient(cluster or address, asynchronous=True)  # type: ignore[no-untyped-call]
            async with connect as dask:
                limit = rate_limit or RateLimit()
                if limit.store is not None:  # the store's budget, shared beyond this run
                    self.client = replace(self.client, rate_limit=limit)
                await dask.register_plugin(BudgetPlugin(), name=PLUGIN_NAME)
                run_id = self.prepared.run.run_id
                await getattr(dask.scheduler, HANDLER)(
                    budget=run_id,
                    action="open",
                    limit={
                        "submits_per_second": limit.submits_per_second,
                        "queries_per_second": limit.queries_per_second,
                    },
                )
                spent, prices = self.charged
                caps = self.template.options.caps
                await getattr(dask.scheduler, GUARD_HANDLER)(
                    run=run_id,
                    action="open",
                    caps=[caps.max_credits, caps.max_cost, caps.max_failures],
                    spent=[spent.credits, spent.cost],
                    prices={res: [c.credits, c.cost] for res, c in prices.items()},
                )
                startup = time.monotonic() - began
                async with anyio.create_task_group() as watching:
                    if progress is not None:
                        reader, every, on_progress = progress
                        ended = lambda: {o.name for o in self.outcomes if o.ended}  # noqa: E731
                        watching.start_soon(
                            watch_progress,
                            dask,
                            reader,
                            ended,
                            run_id,
                            time.monotonic(),
                            every,
                            on_progress,
                        )
                    async with anyio.create_task_group() as group:
                        for outcome in self.outcomes:
                            group.start_soon(self.one, dask, outcome, run_id)
                    watching.cancel_scope.cancel()
                state = await getattr(dask.scheduler, GUARD_HANDLER)(run=run_id, action="state")
                self.stopped_by, self.stop_reason = state.get("stopped_by"), state.get("why", "")
        finally:
            if cluster is not None:
                await cluster.close()  # type: ignore[misc]  # awaitable when asynchronous
        return startup

    async def one(self, dask: DaskClient, outcome: ShardOutcome, budget: str) -> None:
        spec = replace(
            self.template,
            source=f"{shard_folder(outcome.index, outcome.count)}/{self.slice_file}",
            index=outcome.index,
            lines=outcome.lines,
            first_entry=self.prepared.first_entries[outcome.index - 1],
        )
        try:
            outcome.report = await self.tries(dask, outcome, spec, budget)
        except _ShardCrashed as crash:
            outcome.error = crash.__cause__ or crash
        except ImggwError as err:
            outcome.error = err
        if self.on_shard is not None:
            self.on_shard(outcome)

    async def tries(
        self, dask: DaskClient, outcome: ShardOutcome, spec: ShardSpec, budget: str
    ) -> ShardReport:
        """One shard, tried again (tenacity: a few times, backing off) when its try ends
        without a report; a failure no rerun can mend is raised at once."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(_ShardCrashed),
            wait=wait_random_exponential(multiplier=0.5, max=10.0),
            stop=stop_after_attempt(self.retries + 1),
            reraise=True,
        ):
            with attempt:
                outcome.attempts += 1
                key = (
                    f"{SHARD_KEY}{spec.name}-{budget[:8]}-{outcome.attempts}-{secrets.token_hex(3)}"
                )
                future = dask.submit(_shard_task, spec, self.client, budget, key=key, pure=False)
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
                    message = f"shard {spec.name}: {result.error.message}"
                    raise _ShardCrashed(message) from result.error
                assert isinstance(result, ShardReport)
                return result
        raise AssertionError("unreachable")  # pragma: no cover
