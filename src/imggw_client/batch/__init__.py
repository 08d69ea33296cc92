"""Durable batch generation: thousands to millions of requests, each billed once, every result
saved.

Each output folder belongs to one run: its identity (``run.json``) is written before anything
is sent, and every line's idempotency key follows from it, so any re-run of a line, after a
crash, a kill, Ctrl-C or a lost ledger, sends the same key and the gateway replays the task. A
SQLite ledger records each line's task id, state (its task's) and files; results are
downloaded as soon as each task succeeds (the soonest-expiring first), verified by sha256, and
listed in ``manifest.jsonl``; ``index.html`` shows them. Lines with ``task_id`` collect tasks
made elsewhere; :func:`collect_tasks` saves a whole list of them (``imggw download --from``).
Options are those of :class:`BatchOptions`, passed as keywords.

Beyond one machine, a run is cut into shards (contiguous ranges of lines) that run anywhere into
one output folder, a local path or an fsspec URL (``s3://...``): :func:`run_shard` runs one in
this process (``imggw batch --shard I/N``), :func:`run_sharded` runs them all on Dask
(``pip install 'imggw[dask]'``; ``imggw batch --engine dask``), :func:`merge` writes the
folder's ``manifest.jsonl`` from the shards' and :func:`status` reads a run's progress from its
folder alone. Dask is imported only when :func:`run_sharded` is used.

Example::

    from imggw_client.batch import run_batch

    report = run_batch("prompts.jsonl", "out/", concurrency=16)
    print(report.counts, report.credits, report.cost)   # then see out/manifest.jsonl
"""

import importlib
from typing import TYPE_CHECKING, Any

from .._files import StorageError
from .._journal.schema import LEDGER_NAME, ledger_folders, shard_of
from ._admission import GUARDS, INSUFFICIENT_CREDITS, MAX_COST, MAX_CREDITS, MAX_FAILURES
from ._gallery import GALLERY_NAME, write_gallery
from ._identity import InputChangedError, KeyChangedError
from ._input import iter_lines, read_lines
from ._ledger import BatchLockedError
from ._lines import SHOWN_BAD_LINES, BadLine, BatchInputError, InputLine
from ._plan import BatchOptions, RunOptions
from ._report import (
    MANIFEST_NAME,
    BatchProgress,
    BatchReport,
    RunOutcome,
    iter_manifest,
    write_manifest,
)
from ._run import BatchPlan, acollect_tasks, arun_batch, collect_tasks, plan_batch, run_batch
from ._schema import ExitCode, LineState
from .scale._folder import MergeReport, RunStatus, merge, status
from .scale._shards import ShardReport, ShardSpec, arun_shard, parse_shard, run_shard, shard_range
from .scale._storage import Storage, is_url, open_storage

if TYPE_CHECKING:  # for type checkers and editors; at run time they load on first use
    from .scale._dask import (
        DEFAULT_SHARD_SIZE,
        ClientSpec,
        ShardedProgress,
        ShardedReport,
        ShardOutcome,
        arun_sharded,
        run_sharded,
    )

# The Dask engine's names, imported on first use: the SDK never loads Dask unasked.
_DASK_NAMES = (
    "DEFAULT_SHARD_SIZE",
    "ClientSpec",
    "ShardOutcome",
    "ShardedProgress",
    "ShardedReport",
    "arun_sharded",
    "run_sharded",
)


def __getattr__(name: str) -> Any:
    if name in _DASK_NAMES:
        # Through sys.modules, not the package's attributes: an import that cannot happen (no
        # Dask) fails here every time, whatever was imported before.
        dask_driver = importlib.import_module(f"{__name__}.scale._dask")
        return getattr(dask_driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_SHARD_SIZE",
    "GALLERY_NAME",
    "LEDGER_NAME",
    "GUARDS",
    "INSUFFICIENT_CREDITS",
    "MANIFEST_NAME",
    "MAX_COST",
    "MAX_CREDITS",
    "MAX_FAILURES",
    "SHOWN_BAD_LINES",
    "BadLine",
    "BatchInputError",
    "BatchLockedError",
    "BatchOptions",
    "BatchPlan",
    "BatchProgress",
    "BatchReport",
    "ClientSpec",
    "ExitCode",
    "InputChangedError",
    "KeyChangedError",
    "InputLine",
    "LineState",
    "MergeReport",
    "RunOptions",
    "RunStatus",
    "ShardOutcome",
    "RunOutcome",
    "ShardReport",
    "ShardSpec",
    "ShardedProgress",
    "ShardedReport",
    "Storage",
    "StorageError",
    "acollect_tasks",
    "arun_batch",
    "arun_shard",
    "arun_sharded",
    "collect_tasks",
    "is_url",
    "iter_lines",
    "iter_manifest",
    "ledger_folders",
    "merge",
    "open_storage",
    "parse_shard",
    "plan_batch",
    "read_lines",
    "run_batch",
    "run_shard",
    "run_sharded",
    "shard_of",
    "shard_range",
    "status",
    "write_gallery",
    "write_manifest",
]
