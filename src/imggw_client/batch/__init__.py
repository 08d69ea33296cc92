"""Durable batch generation: thousands of requests, each billed once, every result saved.

A SQLite ledger in the output folder records each line's idempotency key (before the first
send), task id, state and files, so re-running the same batch after a crash, a kill or Ctrl-C
resumes it without ever creating a second task for a line. Results are downloaded as soon as
each task succeeds, verified by sha256, and listed in ``manifest.jsonl``.

Example::

    from imggw_client.batch import run_batch

    report = run_batch("prompts.jsonl", "out/", concurrency=16)
    print(report.counts, report.credits, report.cost)   # then see out/manifest.jsonl
"""

from ._input import BadLine, BatchInputError, InputLine, read_lines
from ._ledger import LEDGER_NAME, BatchLockedError
from ._runner import (
    MANIFEST_NAME,
    BatchProgress,
    BatchReport,
    arun_batch,
    manifest_record,
    run_batch,
)

__all__ = [
    "LEDGER_NAME",
    "MANIFEST_NAME",
    "BadLine",
    "BatchInputError",
    "BatchLockedError",
    "BatchProgress",
    "BatchReport",
    "InputLine",
    "arun_batch",
    "manifest_record",
    "read_lines",
    "run_batch",
]
