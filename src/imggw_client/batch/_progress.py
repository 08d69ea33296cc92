"""What a run tells while it goes: a :class:`BatchProgress` snapshot of its lines, money, request
budget and download queue, at most every :data:`PROGRESS_EVERY` seconds and at least every
:data:`PROGRESS_TICK` while the run goes, lines moving or not (:class:`Progress`);
and what the client learned of how long its tasks take, shown there and seeded from the ledger
when a run resumes (DESIGN 15), so that its polls do not start from nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import cast

import anyio
import anyio.to_thread

from .._async_client import AsyncClient
from .._core.durations import WINDOW
from .._core.rules import Resolution
from .._core.spec import Surface
from ..tracking._downloads import DownloadQueue
from ._ledger import Ledger
from ._options import BatchOptions
from ._reports import BatchProgress
from ._schema import UNKNOWN, line_counts
from ._store import RunLines

__all__ = ["PROGRESS_EVERY", "PROGRESS_TICK", "Progress", "learn_from_ledger"]

PROGRESS_EVERY = 0.25  # seconds between progress snapshots
# Seconds between snapshots while no line moves: a display's clock, a log's periodic line
# and the gateway's silence must not wait for the next move, which may be minutes away.
PROGRESS_TICK = 1.0


async def learn_from_ledger(client: AsyncClient, ledger: Ledger) -> None:
    """A resumed run's polls start from what its ledger knows of its tasks' durations
    (DESIGN 15), not from nothing.
    """
    found = await anyio.to_thread.run_sync(ledger.durations, WINDOW)
    for (surface, resolution), took in found.items():
        client.learn_durations(cast(Surface, surface), cast(Resolution, resolution), took)


class Progress:
    """A run's progress, told to ``on_progress`` (None: no one listens) as its lines move,
    never more often than every :data:`PROGRESS_EVERY` seconds unless forced, and every
    :data:`PROGRESS_TICK` seconds while :meth:`tick` runs, whether lines move or not.
    """

    def __init__(
        self,
        on_progress: Callable[[BatchProgress], None] | None,
        client: AsyncClient,
        run: RunLines,
        queue: DownloadQueue,
        options: BatchOptions,
        surface: Surface,
    ) -> None:
        self.on_progress, self.client, self.surface = on_progress, client, surface
        self.run, self.queue, self.options = run, queue, options
        self.last = 0.0  # when the last snapshot was told

    def report(self, force: bool = False) -> None:
        """Tells a snapshot, unless one was told less than :data:`PROGRESS_EVERY` ago."""
        now = time.monotonic()
        if self.on_progress is not None and (force or now - self.last >= PROGRESS_EVERY):
            self.last = now
            self.on_progress(self.snapshot())

    async def tick(self) -> None:
        """Tells a snapshot every :data:`PROGRESS_TICK` seconds until cancelled (a move told
        less than :data:`PROGRESS_EVERY` ago stands for one)."""
        if self.on_progress is None:
            return
        while True:
            await anyio.sleep(PROGRESS_TICK)
            self.report()

    def snapshot(self) -> BatchProgress:
        """The run as it stands now."""
        run, limit = self.run, self.client.rate_limit
        pace = limit.submits_per_second
        shown = limit if pace or limit.queries_per_second else None
        pending = run.counts.get(UNKNOWN, 0)
        expiries = self.queue.expiries()
        soonest = None
        if expiries:
            soonest = datetime.fromtimestamp(expiries[0], tz=timezone.utc)
        return BatchProgress(
            total=run.total,
            counts=line_counts(run.counts),
            credits=run.credits,
            cost=round(run.cost, 6),
            elapsed=time.monotonic() - run.started,
            finished_this_run=run.finished_here,
            rate_limit=shown,
            least_time_left=pending / pace if pace else None,
            awaiting_download=len(self.queue),
            soonest_expiry=soonest,
            at_risk=self.queue.at_risk(expiries),
            cost_unknown=run.cost_unknown,
            max_credits=self.options.max_credits,
            max_cost=self.options.max_cost,
            stopped_by=run.stopped_by,
            typical_durations=self.client.typical_durations(self.surface),
            gateway_silent_for=self.client.gateway_silent_for,
        )
