"""A batch folder made by the release before the one table (ledger format 5), brought forward
and listed, at the sizes batches run at (DESIGN 24).

A format-5 ledger of N lines (1,000,000 by default; each with a prompt of about 60 characters,
a task id, a key, a saved file, credits and cost) is made in a temporary folder. Then, each on
its own copy of that file, in the same run:

- the baseline: ``VACUUM INTO`` a new file, SQLite writing every page of the same rows once;
- ``Ledger.open`` on the folder: the lines moved into the store's one table, in one
  transaction, and its indexes made;
- ``Journal(folder)`` after it: the newest 50 tasks, and the count of all (what ``imggw tasks
  --folder`` asks).

Printed: seconds each, the migration's ratio to the baseline, the file's size before and after.

Run: python bench/store_migration.py [--lines N] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FORMAT_5 = """
CREATE TABLE lines (
    identity TEXT PRIMARY KEY, line INTEGER NOT NULL, caller_id TEXT,
    kind TEXT NOT NULL DEFAULT 'generate', digest TEXT NOT NULL,
    fields TEXT NOT NULL DEFAULT '{}', surface TEXT NOT NULL, idempotency_key TEXT,
    task_id TEXT, state TEXT NOT NULL, urls TEXT NOT NULL DEFAULT '[]', expires_at REAL,
    error_code TEXT, error_message TEXT, files TEXT NOT NULL DEFAULT '[]', credits REAL,
    cost REAL, finished_at REAL, submitted_at REAL, completed_at REAL, first_sent REAL,
    planned INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE INDEX lines_by_line ON lines (planned, line);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('plan', '1');
PRAGMA user_version=5;
"""


def make_ledger(path: Path, lines: int) -> None:
    """A format-5 ledger of ``lines`` saved lines, as that release left a finished run."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(FORMAT_5)
        db.execute("PRAGMA journal_mode=WAL")
        rows = (
            (
                f"line:{n}",
                n,
                f"digest-{n:012d}",
                json.dumps({"prompt": f"a lighthouse at dusk, oil on canvas, study {n}",
                            "aspect_ratio": "16:9", "resolution": "1k"}),
                "beta",
                f"imggw-run-0123456789abcdef-{n:012d}",
                str(10_000_000 + n),
                json.dumps([{"path": f"{10_000_000 + n}-0.png", "sha256": "ab" * 32,
                             "size": 1_234_567}]),
                4.0,
                0.02,
                1.7e9 + n,
            )
            for n in range(1, lines + 1)
        )  # fmt: skip
        with db:
            db.executemany(
                "INSERT INTO lines (identity, line, digest, fields, surface, idempotency_key, "
                "task_id, state, files, credits, cost, planned, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'saved', ?, ?, ?, 1, ?, ?)",
                ((*r, r[-1]) for r in rows),
            )
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def timed(run: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    found = run()
    return time.perf_counter() - start, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from imggw_client.batch._ledger import Ledger
    from imggw_client.tracking import Journal

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        original = root / "format5.sqlite"
        made, _ = timed(lambda: make_ledger(original, args.lines))
        size_before = original.stat().st_size

        base = root / "vacuumed.sqlite"

        def vacuum() -> None:
            with contextlib.closing(sqlite3.connect(original)) as db:
                db.execute("VACUUM INTO ?", (str(base),))

        baseline, _ = timed(vacuum)

        folder = root / "out"
        folder.mkdir(mode=0o700)
        shutil.copyfile(original, folder / "ledger.sqlite")
        (folder / "ledger.sqlite").chmod(0o600)

        def migrate() -> None:
            with Ledger.open(folder):
                pass

        moved, _ = timed(migrate)
        size_after = (folder / "ledger.sqlite").stat().st_size

        journal = Journal(folder)
        newest, listed = timed(lambda: journal.tasks(limit=50))
        counting, total = timed(journal.count)
        journal.close()
        if len(listed) != min(50, args.lines) or total != args.lines:
            raise SystemExit(f"listed {len(listed)} and counted {total} of {args.lines}")

    result = {
        "lines": args.lines,
        "made_s": round(made, 2),
        "baseline_vacuum_into_s": round(baseline, 2),
        "migration_s": round(moved, 2),
        "migration_ratio": round(moved / baseline, 2),
        "newest_50_s": round(newest, 4),
        "count_s": round(counting, 3),
        "size_before_mib": round(size_before / 2**20, 1),
        "size_after_mib": round(size_after / 2**20, 1),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"format-5 ledger of {args.lines:,} lines, {result['size_before_mib']} MiB")
    print(f"  baseline VACUUM INTO     {baseline:8.2f} s")
    print(f"  brought forward (open)   {moved:8.2f} s   {moved / baseline:.2f}x the baseline")
    print(f"  after: {result['size_after_mib']} MiB")
    print(f"  Journal(folder): newest 50 {newest * 1000:.1f} ms, count {counting * 1000:.0f} ms")


if __name__ == "__main__":
    main()
