"""Durable batch generation: thousands to millions of requests, each billed once, every result
saved.

Each output folder belongs to one run: its identity (``run.json``) is written before anything
is sent, and every line's idempotency key follows from it, so any re-run of a line, after a
crash, a kill, Ctrl-C or a lost ledger, sends the same key and the gateway replays the task. A
SQLite ledger records each line's task id, state and files; results are downloaded as soon as
each task succeeds (the soonest-expiring first), verified by sha256, and listed in
``manifest.jsonl``; ``index.html`` shows them. Lines with ``task_id`` collect tasks made
elsewhere.

Example::

    from imggw_client.batch import run_batch

    report = run_batch("prompts.jsonl", "out/", concurrency=16)
    print(report.counts, report.credits, report.cost)   # then see out/manifest.jsonl
"""

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

__all__ = [
    "GALLERY_NAME",
    "LEDGER_NAME",
    "MANIFEST_NAME",
    "BadLine",
    "BatchInputError",
    "BatchLockedError",
    "BatchProgress",
    "BatchReport",
    "InputChangedError",
    "InputLine",
    "StorageError",
    "arun_batch",
    "iter_lines",
    "iter_manifest",
    "manifest_record",
    "read_lines",
    "run_batch",
    "write_gallery",
    "write_manifest",
]
