"""A run of a batch on the tracker's loop (``tracking/_loop``), and its drivers.

:func:`execute` is the one path of a single run, a shard, a shard on a Dask worker and
``download --from``; they differ only in their ``Workspace`` (``_store``: where the run works
and where its results belong). The run is planned (``_plan``), then its ledger's rows go
through the loop as the batch's store (``_store.LedgerStore``) with the batch's one admission
hook (``_admission.BatchHooks``: guards, room, money, gallery); progress is told
(:class:`Progress`: a :class:`BatchProgress` snapshot of its lines, money, request budget and
download queue, at most every :data:`PROGRESS_EVERY` seconds and at least every
:data:`PROGRESS_TICK` while the run goes, and what the client learned of how long its tasks
take, seeded from the ledger when a run resumes, DESIGN 15); the manifest and the gallery are
written at the end, also after a crash of the run.

The drivers: a batch in one process into one local folder (:func:`arun_batch`,
:func:`run_batch`), whose folder is its own result store; tasks made elsewhere saved into one
folder (:func:`acollect_tasks`, :func:`collect_tasks`; DESIGN 12, ``imggw download --from``):
the input is read as a list of tasks (each line a bare id or a JSON object with ``task_id`` and
an optional ``surface``), every task waited on (or asked once) and saved, none submitted; the
folder keeps a ledger and ``manifest.jsonl`` (``line``: the line of the list), so a rerun
resumes and saves nothing twice, and since collecting bills nothing no change of the list is
refused. And a dry run (:func:`plan_batch`, DESIGN 14, ``imggw batch --dry-run``): every check
a run makes before it sends (bad lines, a changed input, a folder in use: the same errors), then
what the run would do, and not one request sent; the plan is made in the folder's ledger,
inside a transaction that is rolled back, so the folder is left as it was (a ledger or folder
that the dry run made is removed).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.to_thread

from .._async_client import AsyncClient
from .._core.config import RateLimit, check_surface
from .._core.durations import WINDOW
from .._core.exceptions import RequestValidationError
from .._core.rules import Resolution
from .._core.spec import Surface
from .._core.states import State
from .._files import StorageError, refuse_links
from .._journal.schema import LEDGER_NAME, RUN_NAME
from ..tracking._loop import DownloadQueue, Loop
from . import _identity
from ._admission import BatchHooks, Charge, Guard, LocalGuard, Room, Spending, Verdict, settles
from ._gallery import GALLERY_DIR, GALLERY_NAME
from ._identity import FolderIdentity
from ._ledger import LOCK_NAME, Ledger, remove_if_empty
from ._lines import BAD_LINES_NAME, COLLECT, GENERATE, BatchInputError
from ._plan import INCOMING_DIR, BatchOptions, Caps, Plan, plan_run
from ._report import MANIFEST_NAME, BatchProgress, BatchReport
from ._schema import BAD, FINAL, KEPT, RUNNING, SUCCEEDED, UNKNOWN, line_counts
from ._store import GalleryPace, LedgerStore, LocalStore, RunLines, Workspace
from .scale._storage import destination_name, local_path

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._plan import RunOptions

__all__ = [
    "BatchPlan",
    "PROGRESS_EVERY",
    "PROGRESS_TICK",
    "Progress",
    "acollect_tasks",
    "arun_batch",
    "client_maker",
    "collect_tasks",
    "execute",
    "learn_from_ledger",
    "local_guard",
    "plan_batch",
    "run_batch",
    "run_blocking",
    "run_id_for",
    "run_in_folder",
]


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


def local_guard(ledger: Ledger, options: BatchOptions) -> LocalGuard:
    """The guard of a run in one process: its caps, what the folder's run was charged so far
    and the highest charge seen per resolution (from its ledger). Blocking.
    """
    prices = {res: Charge(*charge) for res, charge in ledger.charges().items()}
    return LocalGuard(Spending(options.caps, spent=Charge(*ledger.spent()), prices=prices))


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
    # The plan reads the input in a thread of its own, which a cancel (Ctrl-C) leaves behind:
    # it may be blocked for good reading an idle pipe (`imggw batch -`), where no exit may wait
    # for it. Told to stop, it stops at its next line, and the ledger closes between two of
    # its writes.
    stop, planned = threading.Event(), threading.Event()
    made: list[Plan | BaseException] = []

    def plan_apart() -> None:
        try:
            made.append(planning(stop=stop))
        except BaseException as exc:  # handed to the run, which raises it
            made.append(exc)
        finally:
            planned.set()

    threading.Thread(target=plan_apart, name="imggw-plan", daemon=True).start()
    try:
        await anyio.to_thread.run_sync(planned.wait, abandon_on_cancel=True)
        if isinstance(made[0], BaseException):
            raise made[0]
        plan = made[0]
    except BaseException:
        stop.set()
        planned.set()  # the waiting thread ends too
        ledger.discard()  # a refused plan leaves no ledger where there was none
        raise
    # Links kept in clear by versions before links were kept blanked: the key goes now.
    await anyio.to_thread.run_sync(ledger.blank_links, client.redact_url)
    totals = await anyio.to_thread.run_sync(ledger.totals)
    if guard is None:
        guard = await anyio.to_thread.run_sync(local_guard, ledger, options)
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


# The files a run writes into its folder: a symbolic link planted at any of them stops the run
# before it plans (imggw writes through none: see _storage.atomic_write).
FOLDER_FILES = (
    LEDGER_NAME,
    f"{LEDGER_NAME}-wal",
    f"{LEDGER_NAME}-shm",
    LOCK_NAME,
    MANIFEST_NAME,
    RUN_NAME,
    _identity.LINES_NAME,
    GALLERY_NAME,
    GALLERY_DIR,
    BAD_LINES_NAME,
    INCOMING_DIR,
)


def run_id_for(dest: str | Path, client: AsyncClient) -> str:
    """The run id a new run on ``dest`` gets with ``client``: the same for the same folder,
    gateway and API key, on any machine (the key's slow fingerprint makes it: blocking, a few
    tens of milliseconds the first time a client is asked).
    """
    place = destination_name(dest)
    return _identity.derive_run_id(place, client.base_url, client.key_fingerprint)


async def arun_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client: AsyncClient,
    on_progress: Callable[[BatchProgress], None] | None = None,
    **options: Unpack[RunOptions],
) -> BatchReport:
    """Runs (or resumes) a batch: every line submitted once, waited on, downloaded, verified.

    ``source`` is a JSONL or text file (``-``: standard input), or an iterable of requests
    (``ImageRequest``, dicts with the JSONL fields, or prompts); ``options`` are those of
    :class:`BatchOptions` (``concurrency``, ``timeout``, ``line_timeout``, ``surface``,
    ``skip_bad_lines``, ``allow_changes``, ``wait``, ``verify``, ``gallery``, ``format``,
    ``new_run``, and the guards ``max_credits``, ``max_cost``, ``max_failures``). A line with
    ``task_id`` names a task made elsewhere: it is collected (waited on and downloaded), never
    submitted (a whole list of tasks: :func:`collect_tasks`). Bad lines stop the run before
    anything is sent (:class:`BatchInputError`) unless ``skip_bad_lines``; so does an input that
    changed since the folder's run began, or a surface other than its run's
    (:class:`InputChangedError`), unless ``allow_changes``. What ``timeout`` leaves unfinished,
    and a task still running after ``line_timeout`` (default 1800 s), is resumed by the next
    run with the same ``out_dir``.
    A run never submits a line whose result the folder has no room for: short of room it
    finishes what it sent, then raises :class:`StorageError` (the CLI's exit 4).

    The first run on a folder keeps its run id there; every line's key follows from it. That
    id is derived from the folder, the client's gateway and API key (never kept), so a run on
    a folder deleted and made again sends the same keys, and the gateway replays the tasks it
    still remembers instead of billing them again. ``new_run=True`` makes a random id instead
    (new keys, new tasks), in a folder that holds no run.

    Example::

        async with AsyncClient() as client:
            report = await arun_batch("prompts.jsonl", "out/", client=client, concurrency=16)
    """
    chosen = BatchOptions.of(options)
    return await run_in_folder(
        source, out_dir, client=client, options=chosen, on_progress=on_progress
    )


async def run_in_folder(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client: AsyncClient,
    options: BatchOptions,
    on_progress: Callable[[BatchProgress], None] | None = None,
    tasks: bool = False,
) -> BatchReport:
    """A run in one local folder, its own result store: the folder's ledger (locked) and
    identity, then :func:`execute` (``tasks``: the input lists tasks made elsewhere). A run
    refused before anything was kept leaves no empty folder behind.
    """
    folder = local_path(out_dir)
    made = not folder.exists()
    surface = check_surface(options.surface or client.surface)
    named = isinstance(source, (str, Path)) and str(source) != "-"
    title = f"imggw batch: {Path(str(source)).name}" if named else "imggw batch"

    def identity() -> FolderIdentity:
        derive = lambda: run_id_for(folder, client)  # noqa: E731 - called once, if at all
        # The run's template and input, for a rerun and its resume hint (`batch status`).
        source_path = os.path.abspath(str(source)) if named else None
        return FolderIdentity(
            folder,
            surface=surface,
            derive=derive,
            new_run=options.new_run,
            key_fingerprint=client.key_fingerprint,
            name=options.name,
            input_path=source_path,
        )

    try:
        refuse_links(folder, FOLDER_FILES)  # before anything is planned or paid for
        with Ledger.open(folder) as ledger:
            try:
                kept = await anyio.to_thread.run_sync(identity)
            except BaseException:
                ledger.discard()
                raise
            work = Workspace(
                folder, ledger, kept, LocalStore(folder), gallery=title if options.gallery else None
            )
            return await execute(
                source, work, client=client, options=options, on_progress=on_progress, tasks=tasks
            )
    except (
        BatchInputError,
        _identity.InputChangedError,
        RequestValidationError,
        _identity.KeyChangedError,
    ):
        if made:  # refused before anything was kept: no empty folder left behind either
            remove_if_empty(folder)
        raise


def client_maker(
    client_factory: Callable[[], AsyncClient] | None, rate_limit: RateLimit | None
) -> Callable[[], AsyncClient]:
    """What the blocking entry points make their client with: the caller's factory, or an
    ``AsyncClient`` from the environment with ``rate_limit`` (not both)."""
    if client_factory is not None and rate_limit is not None:
        raise RequestValidationError(
            "rate_limit", "give it to the client your client_factory makes", code="invalid_option"
        )
    if client_factory is not None:
        return client_factory
    return lambda: AsyncClient(rate_limit=rate_limit)


def run_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client_factory: Callable[[], AsyncClient] | None = None,
    rate_limit: RateLimit | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    **options: Unpack[RunOptions],
) -> BatchReport:
    """The blocking form of :func:`arun_batch`. ``client_factory`` makes the AsyncClient to use
    (default: ``AsyncClient(rate_limit=rate_limit)`` from ``IMGGW_API_KEY`` /
    ``IMGGW_BASE_URL``); ``rate_limit`` is the request budget of that default client (give
    your factory's client its own).

    Example::

        report = run_batch("prompts.jsonl", "out/", concurrency=16, timeout=3600)
        sys.exit(report.exit_code)
    """
    return run_blocking(
        source,
        out_dir,
        client_factory=client_factory,
        rate_limit=rate_limit,
        on_progress=on_progress,
        options=options,
    )


def run_blocking(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client_factory: Callable[[], AsyncClient] | None,
    rate_limit: RateLimit | None,
    on_progress: Callable[[BatchProgress], None] | None,
    options: RunOptions,
    tasks: bool = False,
) -> BatchReport:
    """:func:`run_in_folder` to its end in this thread, with a client made for it (see
    :func:`client_maker`): the blocking entry points (``run_batch``, ``collect_tasks``).
    """
    make = client_maker(client_factory, rate_limit)
    chosen = BatchOptions.of(options)  # a bad option is refused before a client is made

    async def main() -> BatchReport:
        async with make() as client:
            return await run_in_folder(
                source, out_dir, client=client, options=chosen, on_progress=on_progress, tasks=tasks
            )

    return anyio.run(main)


async def acollect_tasks(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client: AsyncClient,
    on_progress: Callable[[BatchProgress], None] | None = None,
    **options: Unpack[RunOptions],
) -> BatchReport:
    """Saves the results of the tasks ``source`` lists into ``out_dir``, the soonest-expiring
    first, a dead link asked for again; a rerun resumes. ``source`` is a file (``-``: standard
    input) or an iterable of task ids and dicts with ``task_id`` (and ``surface``). With
    ``wait=False`` each unfinished task is asked about once and reported (exit code 3), the
    rest saved. A bad line stops the run before anything is sent (:class:`BatchInputError`)
    unless ``skip_bad_lines``; a task the gateway does not know fails its own line only.
    ``options`` are those of :func:`run_batch` (its guards see nothing here: collecting bills
    nothing).

    Example::

        async with AsyncClient() as client:
            report = await acollect_tasks("ids.txt", "out/", client=client, concurrency=16)
    """
    chosen = BatchOptions.of(options)
    return await run_in_folder(
        source, out_dir, client=client, options=chosen, on_progress=on_progress, tasks=True
    )


def collect_tasks(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    *,
    client_factory: Callable[[], AsyncClient] | None = None,
    rate_limit: RateLimit | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    **options: Unpack[RunOptions],
) -> BatchReport:
    """The blocking form of :func:`acollect_tasks` (``client_factory`` and ``rate_limit`` as
    in :func:`run_batch`).

    Example::

        report = collect_tasks([{"task_id": task.id, "surface": "beta"}], "out/")   # or task.id
        sys.exit(report.exit_code)
    """
    return run_blocking(
        source,
        out_dir,
        client_factory=client_factory,
        rate_limit=rate_limit,
        on_progress=on_progress,
        options=options,
        tasks=True,
    )


DEFAULT_SURFACE = "beta"


@dataclass(frozen=True)
class BatchPlan:
    """What a run of the folder would do now. Lines: ``total`` (bad ones included),
    ``to_submit`` (never sent), ``to_wait`` (sent, unfinished: waited on, then downloaded),
    ``to_collect`` (tasks made elsewhere, not saved yet), ``done`` (finished: saved, failed or
    expired), ``changed`` (new or changed since the folder's run: new requests), ``bad``.
    ``estimate`` is what the lines to submit would cost (``{credits, cost}``, from the highest
    charge this folder's run has seen per resolution; None before any charge), ``spent`` what
    the folder's run was charged so far, and with a cap, ``fit`` how many of the lines to
    submit fit under it at the prices seen (None without a cap, or before any charge).
    ``comments`` counts the input's comment lines, skipped (``#`` then whitespace or nothing:
    ``#hashtag sunset`` is a prompt, counted in ``total``).

    Example::

        plan = plan_batch("prompts.jsonl", "out/", max_credits=400)
        print(plan.to_submit, plan.estimate, plan.fit)
    """

    total: int
    to_submit: int
    to_wait: int
    to_collect: int
    done: int
    changed: int
    bad: int
    estimate: dict[str, float | None] | None
    spent: dict[str, float | None]
    fit: int | None = None
    max_credits: float | None = None
    max_cost: float | None = None
    comments: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The plan as ``imggw batch --dry-run --json`` prints it."""
        return asdict(self)


def plan_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    **options: Unpack[RunOptions],
) -> BatchPlan:
    """What :func:`run_batch` with the same input, folder and options would do now, with every
    check it makes before sending (:class:`BatchInputError`, :class:`InputChangedError`,
    :class:`BatchLockedError`: the same errors) and not one request sent. The folder is left as
    it was. No API key is needed: nothing is sent and no key is made.

    Example::

        plan = plan_batch("prompts.jsonl", "out/", max_credits=400)
        if plan.fit is not None and plan.fit < plan.to_submit:
            print(f"only {plan.fit} of {plan.to_submit} lines fit under the cap")
    """
    chosen = BatchOptions.of(options)
    folder = local_path(out_dir)
    made = not folder.exists()
    found: list[BatchPlan] = []
    try:
        with Ledger.open(folder) as ledger:
            try:
                kept = _identity.load(folder)
                surface = check_surface(
                    chosen.surface or (kept.surface if kept else None) or DEFAULT_SURFACE
                )
                # No key is made in a dry run: any run id will do (nothing is kept).
                identity = FolderIdentity(folder, surface=surface, new_run=chosen.new_run)

                def look(planned: Ledger, plan: Plan) -> None:
                    found.append(_look(planned, plan, chosen))

                plan_run(
                    source, folder, ledger, identity, surface=surface, options=chosen, dry=look
                )
            finally:
                ledger.discard()  # only if this dry run made it
    finally:
        if made:
            remove_if_empty(folder)
    return found[0]


def _look(ledger: Ledger, plan: Plan, options: BatchOptions) -> BatchPlan:
    kinds = ledger.kinds()
    prices = {res: Charge(*charge) for res, charge in ledger.charges().items()}
    spent = Charge(*ledger.spent())  # the folder's, as the run's guard counts it
    spending = Spending(options.caps, spent=spent, prices=prices)
    pending = ledger.waiting_by_resolution(UNKNOWN)
    estimate = None
    if prices:
        credits, cost = 0.0, 0.0
        for res, n in pending.items():
            each = spending.estimate(res) or Charge()
            credits += (each.credits or 0.0) * n
            cost += (each.cost or 0.0) * n
        stated_cost = any(p.cost is not None for p in prices.values())
        estimate = {"credits": credits, "cost": round(cost, 6) if stated_cost else None}
    fit = None
    if options.caps.spend and prices:
        fit = 0
        for res in _in_order(ledger):
            if spending.admit(fit, res) is not Verdict.GO:
                break
            spending.charged(fit, res, Charge(), spending.estimate(res) or Charge(), final=True)
            fit += 1
    seen_cost = spent.cost or any(p.cost is not None for p in prices.values())

    def count(kind: str, states: Iterable[State]) -> int:
        return sum(kinds.get((kind, state), 0) for state in states)

    unfinished = [s for s in KEPT if s not in FINAL and s is not UNKNOWN]
    return BatchPlan(
        total=sum(kinds.values()),
        to_submit=count(GENERATE, [UNKNOWN]),
        to_wait=count(GENERATE, unfinished),
        to_collect=count(COLLECT, [s for s in KEPT if s not in FINAL]),
        done=count(GENERATE, FINAL) + count(COLLECT, FINAL),
        changed=plan.changed_count,
        bad=count(BAD, KEPT),
        estimate=estimate,
        spent={
            "credits": spent.credits,
            "cost": round(spent.cost or 0.0, 6) if seen_cost else None,
        },
        fit=fit,
        max_credits=options.max_credits,
        max_cost=options.max_cost,
        comments=plan.comments,
    )


def _in_order(ledger: Ledger) -> Iterable[str]:
    """The resolutions of the lines to submit, in line order (the order a run sends them)."""
    for row in ledger.iter_rows(states=(UNKNOWN,)):
        if row.kind == GENERATE:
            yield str(row.fields.get("resolution", ""))
