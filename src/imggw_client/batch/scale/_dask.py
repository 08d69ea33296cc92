"""Sharded batches on Dask (``pip install 'imggw[dask]'``): a driver that cuts the input into
shards, one Dask task each, on an existing cluster or a local one it starts and stops.

Before anything is dispatched the driver checks the whole input (``_plan.scan_input``: bad
lines, repeated ids, lines changed since the run began, refused unless allowed), makes the
run's identity once, and puts each shard's slice of the input in the output folder, where every
worker can read it. Each shard is one ``async def`` task on a worker's event loop, running a
shard (``_shards.arun_shard``) with an ``AsyncClient`` made there: the API key never travels
in a task; each worker reads ``IMGGW_API_KEY`` from its own environment.

Exactly once comes from the keys, not from the engine: Dask runs a task again when its worker
dies (and may rerun a finished one, dask/distributed#7870); a shard run again sends the same
keys and the gateway replays its tasks. A shard whose worker dies, or that raises, is run again
(a few times, with tenacity's backoff); the others go on; one that keeps failing is reported
(``_dask_dispatch`` runs the shards on the cluster). One request budget for the whole run lives
on the scheduler (``_dask_budget``); progress between shard completions is read from the output
folder (``_dask_progress``).
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import anyio
import anyio.to_thread

from ..._core.config import RateLimit, check_surface
from ..._core.exceptions import ConfigurationError, RequestValidationError
from ..._journal.schema import RUN_NAME
from .. import _identity
from .._input import count_lines
from .._plan import BatchOptions, scan_input
from .._schema import ExitCode
from ._dask_dispatch import RUN_FATAL, ClientSpec, Dispatch, Prepared, ShardError, ShardOutcome
from ._dask_progress import PROGRESS_EVERY, ProgressReader, ShardedProgress, entries
from ._folder import MergeReport, charges, merge
from ._shards import (
    CHECKPOINT_EVERY,
    ShardSpec,
    env_fingerprint,
    env_run_id,
    scratch_folder,
    shard_name,
    slice_name,
    write_slices,
)
from ._storage import Storage, open_storage

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .._plan import RunOptions

__all__ = [
    "ClientSpec",
    "ShardError",
    "ShardOutcome",
    "ShardedProgress",
    "ShardedReport",
    "arun_sharded",
    "run_sharded",
]

DEFAULT_SHARD_SIZE = 1000
SHARD_RETRIES = 3  # a shard that fails is run this many more times before it is reported
P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class ShardedReport:
    """What a sharded run did: each shard's outcome, the merged manifest, and the exit code as
    ``imggw batch`` gives it (0 all succeeded, 1 some failed, 3 some unfinished: run the same
    command again to resume; 6 a guard stopped new submits, ``stopped_by`` names it).
    ``startup`` is the seconds the engine took to be ready; ``retried`` how many shard tries
    failed and ran again.

    Example::

        report = run_sharded("prompts.jsonl", "out/", workers=2)   # "s3://bucket/run" too
        print(report.merged.counts, report.failed_shards)
    """

    shards: list[ShardOutcome]
    merged: MergeReport
    elapsed: float
    startup: float
    changed_lines: list[int] = field(default_factory=list)
    changed_count: int = 0
    bad_count: int = 0
    stopped_by: str | None = None
    stop_reason: str = ""
    comments: int = 0  # the input's comment lines, skipped

    @property
    def failed_shards(self) -> list[ShardOutcome]:
        return [s for s in self.shards if s.report is None]

    @property
    def retried(self) -> int:
        return sum(s.attempts - 1 for s in self.shards)

    @property
    def exit_code(self) -> ExitCode:
        if self.stopped_by is not None:
            return ExitCode.STOPPED
        return ExitCode.UNFINISHED if self.failed_shards else self.merged.exit_code


def _prepare(
    source: str,
    storage: Storage,
    work: Path,
    *,
    surface: str,
    shard_size: int,
    options: BatchOptions,
    run_id: Callable[[], str],
    with_entries: bool,
    fingerprint: str | None = None,
) -> Prepared:
    """The whole input checked and the run's identity made, before any shard is dispatched;
    then each shard's slice put in the output folder (and, ``with_entries``, how many entries
    each has). Blocking. All of it reads one copy of the input: a file edited meanwhile must not
    slip an unchecked line into a slice."""
    copy = work / "input" / Path(source).name
    origin = os.path.abspath(source)  # the input as the caller named it, for a rerun's hint
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
        scan = scan_input(source, work, surface=surface, record=record, options=options)
        try:
            found = scan.plan.input_digest
            run = _identity.load_stored(storage)
            if run is None:
                made = _identity.claim(
                    storage,
                    scan.digests,
                    found,
                    run_id=run_id(),
                    surface=surface,
                    key_fingerprint=fingerprint,
                    name=options.name,
                    input_path=origin,
                )
                run, created = made
                if not created and run.input_digest != found:
                    continue  # compare again, with the record its maker published
            # Before any slice is cut: a folder made with another key is refused here, whole.
            run = _identity.adopt_key(storage, run, fingerprint)
            if run.input_digest != found:  # changes, allowed
                _identity.publish_lines(storage, scan.digests)
                # The rest kept: it names the run's key, template and input.
                run = replace(run, input_digest=found, surface=run.surface or surface)
                storage.write(RUN_NAME, _identity.identity_bytes(run))
            count = max(1, math.ceil(total / shard_size))
            how = options.format  # how the input is read: its cuts
            first_entries = write_slices(source, storage, count, total, work, format=how)
            per_shard = entries(source, count, total, format=how) if with_entries else []
            return Prepared(run, total, count, scan, first_entries, per_shard)
        finally:
            scan.discard()
    raise ConfigurationError(  # pragma: no cover - two runs racing twice on a fresh folder
        f"another run with another input began in {storage.url} at the same moment"
    )


def _check_counts(**values: tuple[object, int]) -> None:
    for name, (value, least) in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise RequestValidationError(name, f"must be an integer >= {least}")


def _check_seconds(**values: object) -> None:
    for name, seconds in values.items():
        number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not number or not 0 < seconds < math.inf:  # type: ignore[operator]
            raise RequestValidationError(name, "must be a number of seconds > 0")


async def arun_sharded(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    address: str | None = None,
    workers: int | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    client: ClientSpec | None = None,
    rate_limit: RateLimit | None = None,
    storage_options: dict[str, Any] | None = None,
    scratch: str | os.PathLike[str] | None = None,
    shard_retries: int = SHARD_RETRIES,
    checkpoint_every: float = CHECKPOINT_EVERY,
    on_shard: Callable[[ShardOutcome], None] | None = None,
    on_progress: Callable[[ShardedProgress], None] | None = None,
    progress_every: float = PROGRESS_EVERY,
    cluster_options: dict[str, Any] | None = None,
    **options: Unpack[RunOptions],
) -> ShardedReport:
    """Runs (or resumes) a batch as shards on Dask, into ``dest`` (a folder or an fsspec URL
    every worker reaches), then merges ``DEST/manifest.jsonl`` and ``index.html``.

    ``address`` is a running scheduler (``tcp://host:8786``); ``workers`` starts a local cluster
    of that many processes for this run and stops it after. Each shard is ``shard_size`` lines
    run as a shard with the run's ``options`` (those of :func:`run_batch`); ``rate_limit``
    is one budget for the whole run, held by the scheduler. ``client`` says how workers reach
    the gateway (default: their ``IMGGW_BASE_URL``); the key is read from each worker's
    ``IMGGW_API_KEY``. The scheduler and workers need imggw installed. Bad or changed input is
    refused before anything is dispatched, as in :func:`run_batch`. A shard that fails is run
    again up to ``shard_retries`` times; a remote folder's shards checkpoint their ledgers
    every ``checkpoint_every`` seconds. ``on_shard`` is called as each shard ends;
    ``on_progress`` every ``progress_every`` seconds with a :class:`ShardedProgress`, read by a
    thread of its own: a reading that fails is skipped, and the run never waits for one. Both
    are called on the event loop; what they raise ends the run, as an interruption does.
    ``cluster_options`` go to the local cluster (``workers``).

    Example::

        # not run: an S3 bucket of yours
        report = await arun_sharded("prompts.jsonl", "s3://bucket/run", workers=4,
                                    shard_size=5000, rate_limit=RateLimit(submits_per_second=20))
    """
    if (address is None) == (workers is None):
        raise RequestValidationError(
            "engine",
            "give the cluster's address or a number of workers (one of them)",
            code="invalid_option",
        )
    counts = {"shard_size": (shard_size, 1), "shard_retries": (shard_retries, 0)}
    _check_counts(**counts, **({"workers": (workers, 1)} if workers is not None else {}))
    _check_seconds(checkpoint_every=checkpoint_every, progress_every=progress_every)
    chosen = BatchOptions.of(options)
    source = os.fspath(source)
    if source == "-" or not Path(source).is_file():
        raise RequestValidationError(
            "source", f"{source} must be a file: shards are cut from a file read twice"
        )
    dest = os.fspath(dest)
    spec = client or ClientSpec()
    surface = check_surface(chosen.surface or spec.surface)
    started = time.monotonic()
    storage = open_storage(dest, storage_options)
    work = scratch_folder(storage.url, scratch) / f"driver-{secrets.token_hex(4)}"
    work.mkdir(parents=True, exist_ok=True)
    run_id = functools.partial(env_run_id, storage, spec.base_url)
    try:
        fingerprint = await anyio.to_thread.run_sync(env_fingerprint)  # slow, once
        prepared = await anyio.to_thread.run_sync(
            functools.partial(
                _prepare,
                source,
                storage,
                work,
                surface=surface,
                shard_size=shard_size,
                options=chosen,
                run_id=run_id,
                with_entries=on_progress is not None,
                fingerprint=fingerprint,
            )
        )
    finally:
        await anyio.to_thread.run_sync(functools.partial(shutil.rmtree, work, ignore_errors=True))
    # Every shard takes the lines the driver accepted: changes were allowed here, or refused.
    template = ShardSpec(
        source="",
        dest=dest,
        index=1,
        count=prepared.count,
        sliced=True,
        options=replace(chosen, surface=surface, allow_changes=True),
        storage_options=dict(storage_options or {}),
        scratch=None if scratch is None else os.fspath(scratch),
        checkpoint_every=checkpoint_every,
    )
    dispatch = Dispatch(prepared, slice_name(source), template, spec, shard_retries, on_shard)
    # One count for the whole run, on the scheduler, from what the folder's run was charged.
    dispatch.charged = await anyio.to_thread.run_sync(charges, storage)
    progress = None
    if on_progress is not None:
        names = [shard_name(i, prepared.count) for i in range(1, prepared.count + 1)]
        reader = ProgressReader(
            storage,
            names,
            prepared.entries,
            prepared.scan.plan.bad_count,
            checkpoint_every=checkpoint_every,
        )
        progress = (reader, progress_every, on_progress)
    startup = await dispatch.run(address, workers, rate_limit, cluster_options or {}, progress)
    for outcome in dispatch.outcomes:  # a failure no rerun can mend ends the run as one would
        if outcome.report is None and isinstance(outcome.error, RUN_FATAL):
            raise outcome.error
    merged = await anyio.to_thread.run_sync(
        functools.partial(merge, dest, storage_options=storage_options)
    )
    plan = prepared.scan.plan
    return ShardedReport(
        shards=dispatch.outcomes,
        merged=merged,
        elapsed=time.monotonic() - started,
        startup=startup,
        changed_lines=plan.changed,
        changed_count=plan.changed_count,
        bad_count=plan.bad_count,
        stopped_by=dispatch.stopped_by,
        stop_reason=dispatch.stop_reason,
        comments=plan.comments,
    )


def _blocking(run: Callable[P, Awaitable[R]]) -> Callable[P, R]:
    """The blocking twin of an async entry point: the same parameters, run by ``anyio.run``."""

    @functools.wraps(run)
    def blocking(*args: P.args, **kwargs: P.kwargs) -> R:
        return anyio.run(functools.partial(run, *args, **kwargs))

    return blocking


run_sharded = _blocking(arun_sharded)
run_sharded.__name__ = run_sharded.__qualname__ = "run_sharded"
run_sharded.__doc__ = """The blocking form of :func:`arun_sharded`, with the same parameters.

    Example::

        # not run: a Dask scheduler and an S3 bucket of yours
        report = run_sharded("prompts.jsonl", "s3://bucket/run", address="tcp://10.0.0.5:8786",
                             shard_size=5000, rate_limit=RateLimit(submits_per_second=20))
        sys.exit(report.exit_code)
    """
