"""What a run tells while it goes and when it ends (``batch/_report.py``): the display's
words, the pace and time left of a progress snapshot, and a report's exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from imggw_client.batch._lines import BadLine
from imggw_client.batch._report import BatchProgress, BatchReport
from imggw_client.batch._schema import ExitCode, LineState

PENDING, RUNNING, DOWNLOADING, SAVED, FAILED, EXPIRED = LineState  # what a report counts


def test_a_snapshot_tells_lines_finished_their_pace_and_the_time_left() -> None:
    progress = BatchProgress(
        total=10,
        counts={SAVED: 3, EXPIRED: 1, RUNNING: 2, PENDING: 4},
        credits=12.0,
        cost=0.03,
        elapsed=8.0,
        finished_this_run=4,
    )
    assert progress.finished == 4
    assert progress.throughput == 0.5
    assert progress.eta == 12.0  # 6 lines left at half a line a second
    assert progress.words == {
        "pending": 4,
        "running": 2,
        "downloading": 0,
        "succeeded": 3,
        "failed": 1,
    }
    just_begun = BatchProgress(
        total=10, counts={PENDING: 10}, credits=0.0, cost=0.0, elapsed=0.0, finished_this_run=0
    )
    assert just_begun.throughput == 0.0
    assert just_begun.eta is None


def test_a_reports_exit_code_counts_bad_lines_and_a_guard() -> None:
    def report(counts: dict[LineState, int], **kw: Any) -> BatchReport:
        kw.setdefault("bad_lines", [])
        return BatchReport(
            counts=counts, changed_lines=[], manifest=Path("manifest.jsonl"), elapsed=1.0, **kw
        )

    assert report({SAVED: 2}).exit_code is ExitCode.OK
    assert report({SAVED: 2}, bad_lines=[BadLine(3, "x")], bad_count=1).exit_code == 1
    assert report({SAVED: 1, DOWNLOADING: 1}).exit_code is ExitCode.UNFINISHED
    assert report({PENDING: 5}, stopped_by="max_credits").exit_code is ExitCode.STOPPED
    done = report({SAVED: 2, EXPIRED: 1})
    assert (done.total, done.exit_code) == (3, ExitCode.SOME_FAILED)
    assert done.statuses == {"pending": 0, "running": 0, "succeeded": 2, "failed": 1}
