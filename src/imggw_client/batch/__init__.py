"""Durable batch generation: thousands to millions of requests, each billed once, every result
saved.

Each output folder belongs to one run: its identity (``run.json``) is written before anything
is sent, and every line's idempotency key follows from it, so any re-run of a line, after a
crash, a kill, Ctrl-C or a lost ledger, sends the same key and the gateway replays the task. A
SQLite ledger records each line's task id, state and files; results are downloaded as soon as
each task succeeds (the soonest-expiring first), verified by sha256, and listed in
``manifest.jsonl``; ``index.html`` shows them. Lines with ``task_id`` collect tasks made
elsewhere.

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

from typing import Any

from ._gallery import GALLERY_NAME, iter_manifest, write_gallery
from ._identity import InputChangedError
from ._input import BadLine, BatchInputError, InputLine, iter_lines, read_lines
from ._ledger import LEDGER_NAME, BatchLockedError, StorageError
from ._runner import (
    MANIFEST_NAME,
    BatchProgress,
    BatchReport,
    arun_batch,
    manifest_record,
    run_batch,
    write_manifest,
)
from ._shards import (
    MergeReport,
    RunStatus,
    ShardReport,
    ShardSpec,
    arun_shard,
    merge,
    parse_shard,
    run_shard,
    shard_range,
    status,
)

# The Dask engine's names, imported on first use: the SDK never loads Dask unasked.
_DASK_NAMES = (
    "ClientSpec", "ShardOutcome", "ShardedProgress", "ShardedReport", "arun_sharded", "run_sharded",
)  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _DASK_NAMES:
        from . import _dask

        return getattr(_dask, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GALLERY_NAME",
    "LEDGER_NAME",
    "MANIFEST_NAME",
    "BadLine",
    "BatchInputError",
    "BatchLockedError",
    "BatchProgress",
    "BatchReport",
    "ClientSpec",
    "InputChangedError",
    "InputLine",
    "MergeReport",
    "RunStatus",
    "ShardOutcome",
    "ShardReport",
    "ShardSpec",
    "ShardedProgress",
    "ShardedReport",
    "StorageError",
    "arun_batch",
    "arun_shard",
    "arun_sharded",
    "iter_lines",
    "iter_manifest",
    "manifest_record",
    "merge",
    "parse_shard",
    "read_lines",
    "run_batch",
    "run_shard",
    "run_sharded",
    "shard_range",
    "status",
    "write_gallery",
    "write_manifest",
]
