"""A planned run of a batch on the tracker's loop (``tracking/_loop``): the one path of a single
run, a shard, a shard on a Dask worker and ``download --from``. They differ only in their
``Workspace`` (``_workspace``: where the run works and where its results belong).

The run is planned (``_plan``), then its ledger's rows go through the loop as the batch's store
(``_ledger_store``) with the batch's hooks (``_hooks``: guards, room, money, gallery); progress
is told (``_progress``); the manifest and the gallery are written at the end, also after a
crash of the run.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from .._async_client import AsyncClient
from .._core.config import check_surface
from .._files import StorageError
from ..tracking._loop import Loop
from ._admission import BatchHooks, Charge, Guard, LocalGuard, Room, Spending, settles
from ._ledger import Ledger, Totals
from ._options import BatchOptions, Caps
from ._plan import Plan, plan_run
from ._progress import Progress, learn_from_ledger
from ._reports import BatchProgress, BatchReport
from ._schema import RUNNING, SUCCEEDED, line_counts
from ._store import GalleryPace, LedgerStore, RunLines, Workspace

__all__ = ["execute", "local_guard"]


def local_guard(ledger: Ledger, totals: Totals, options: BatchOptions) -> LocalGuard:
    """The guard of a run in one process: its caps, what the folder's run was charged so far
    and the highest charge seen per resolution (from its ledger). Blocking.
    """
    prices = {res: Charge(*charge) for res, charge in ledger.charges().items()}
    spent = Charge(totals.credits, totals.cost)
    return LocalGuard(Spending(options.caps, spent=spent, prices=prices))


async def _count_in_flight(ledger: Ledger, guard: Guard) -> None:
    """Lines sent by an earlier run whose price is not known yet (no charge stated, or 0
    while running) count in flight for the guard, as if this run had sent them (a cap holds
    across reruns)."""
    rows = await anyio.to_thread.run_sync(
        lambda: [r for r in ledger.iter_rows(states=(RUNNING,)) if r.made_here]
    )
    for row in rows:
        if not settles(Charge(row.credits, row.cost).clamped(), final=False):
            await guard.flying(row.identity, str(row.fields.get("resolution", "")))


def _verify_files(run: RunLines, work: Workspace, *, hashes: bool) -> None:
    """Saved lines whose files are missing or damaged go back to be downloaded again: a
    size check by default, every file's sha256 with ``hashes``. Such a line keeps its list
    of files until it is saved again: that it was saved once tells a result gone at the
    gateway from one that expired before its download. Blocking; before the run."""
    for row in work.damaged(hashes=hashes):
        run.move(row, SUCCEEDED, at_once=True)


def _finish(run: RunLines, work: Workspace) -> Path:
    """Everything saved, the manifest and the gallery written: also after a crash of the
    run (an interrupted run's manifest shows where it stopped). Blocking."""
    try:
        work.ledger.flush()
    except StorageError as err:
        run.fatal = run.fatal or err
    return work.write_outputs(run.stopped_by)


def _report(
    run: RunLines, options: BatchOptions, plan: Plan, manifest: Path, elapsed: float
) -> BatchReport:
    """What the run did, for its caller."""
    return BatchReport(
        counts=line_counts(run.counts),
        bad_lines=plan.bad,
        changed_lines=plan.changed,
        manifest=manifest,
        elapsed=elapsed,
        credits=run.credits,
        cost=round(run.cost, 6),
        bad_count=plan.bad_count,
        changed_count=plan.changed_count,
        removed_lines=plan.removed,
        removed_count=plan.removed_count,
        bad_lines_file=plan.bad_file,
        previous_surface=plan.previous_surface,
        cost_unknown=run.cost_unknown,
        stopped_by=run.stopped_by,
        stop_reason=run.stop_reason,
        max_credits=options.max_credits,
        max_cost=options.max_cost,
        max_failures=options.max_failures,
        comments=plan.comments,
    )


async def execute(
    source: str | Path | Iterable[Any],
    work: Workspace,
    *,
    client: AsyncClient,
    options: BatchOptions,
    on_progress: Callable[[BatchProgress], None] | None = None,
    guard: Guard | None = None,
    tasks: bool = False,
) -> BatchReport:
    """Plans and runs a run in its workspace on the tracker's loop. A plan that may not go
    raises before anything is sent (and a ledger this process made for it is removed).
    ``guard`` keeps the run's caps (default: one in this process, from ``options`` and the
    folder's ledger; a Dask run's is held by its scheduler). ``tasks``: the input lists tasks
    made elsewhere (``collect_tasks``), each waited on and saved, none submitted.
    """
    started = time.monotonic()
    surface = check_surface(options.surface or client.surface)
    ledger = work.ledger
    planning = functools.partial(
        plan_run,
        source,
        work.folder,
        ledger,
        work.identity,
        surface=surface,
        options=options,
        part=work.part,
        tasks=tasks,
    )
    try:
        plan: Plan = await anyio.to_thread.run_sync(planning)
    except BaseException:
        ledger.discard()  # a refused plan leaves no ledger where there was none
        raise
    # Links kept in clear by versions before links were kept blanked: the key goes now.
    await anyio.to_thread.run_sync(ledger.blank_links, client.redact_url)
    totals = await anyio.to_thread.run_sync(ledger.totals)
    if guard is None:
        guard = await anyio.to_thread.run_sync(local_guard, ledger, totals, options)
    room = Room(work.folder)
    run = RunLines(
        ledger,
        totals,
        room,
        deadline=started + options.seconds,
        line_timeout=options.line_timeout,
        redact=client.redact,
    )
    hooks = BatchHooks(run, guard, room, GalleryPace(work))
    loop = Loop(
        client,
        LedgerStore(run, work, surface, options.template),
        hooks,
        run,
        concurrency=options.concurrency,
        wait=options.wait,
        guarded=options.caps != Caps(),
    )
    progress = Progress(on_progress, client, run, loop.queue, options, surface)
    run.tell = progress.report
    await _count_in_flight(ledger, guard)
    await room.count_unsaved(ledger)
    await learn_from_ledger(client, ledger)
    await anyio.to_thread.run_sync(work.sweep_partial_files)
    await anyio.to_thread.run_sync(
        functools.partial(_verify_files, run, work, hashes=options.verify)
    )
    progress.report(force=True)
    try:
        seconds = options.seconds
        with anyio.move_on_after(seconds if math.isfinite(seconds) else None):
            await loop.run(progress.tick)
    finally:
        with anyio.CancelScope(shield=True):
            manifest = await anyio.to_thread.run_sync(_finish, run, work)
    if run.fatal is not None:
        raise run.fatal
    if room.no_room is not None:  # what was in flight is saved; the disk is what to fix
        raise room.no_room
    progress.report(force=True)
    return _report(run, options, plan, manifest, time.monotonic() - started)
