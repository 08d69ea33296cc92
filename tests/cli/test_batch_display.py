"""How ``imggw batch`` shows its progress: one overall bar above the counts on a terminal, a
parseable line otherwise, the request budget and the results waiting for download, and one
warning when links will die before their download turn."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from imggw_cli._batch_run import batch_display, progress_text, progress_view
from imggw_cli._globals import Globals
from imggw_cli._output import Output
from imggw_client import RateLimit
from imggw_client.batch import BatchProgress

from .helpers import on_a_terminal

AT_RISK = (
    "warning: {n} results will expire before their download turn at the current pace; "
    "raise --concurrency"
)


def progress(**fields: Any) -> BatchProgress:
    base: dict[str, Any] = {
        "total": 10,
        "counts": {"pending": 5, "running": 2, "saved": 3},
        "credits": 12.0,
        "cost": 0.03,
        "elapsed": 6.0,
        "finished_this_run": 3,
    }
    return BatchProgress(**{**base, **fields})


def test_the_line_form_adds_the_budget_and_the_downloads_waiting(cli_now: datetime) -> None:
    assert progress_text(progress()) == (  # as it always was, when there is nothing to add
        "batch: 3/10 finished (pending 5, running 2, succeeded 3); 0.5/s, eta 14s; "
        "credits 12, cost 0.03"
    )
    line = progress_text(
        progress(
            rate_limit=RateLimit(submits_per_second=2, queries_per_second=10),
            least_time_left=250.0,
            awaiting_download=3,
            soonest_expiry=cli_now + timedelta(hours=2) - timedelta(seconds=30),
        )
    )
    assert line == (
        "batch: 3/10 finished (pending 5, running 2, succeeded 3); 0.5/s, eta 14s; "
        "credits 12, cost 0.03; budget 2 submits/s, 10 queries/s; "
        "the 5 lines left need at least 4 min; "
        "awaiting download 3, soonest expiry in 1 h 59 min"
    )
    queries_only = progress_text(progress(rate_limit=RateLimit(queries_per_second=0.5)))
    assert queries_only.endswith("; budget 0.5 queries/s")


def render(view: Any) -> list[str]:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(view)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return [line.rstrip() for line in text.splitlines()]


def test_the_live_view_has_one_bar_for_the_batch_above_the_counts(cli_now: datetime) -> None:
    lines = render(
        progress_view(
            progress(
                rate_limit=RateLimit(submits_per_second=2),
                least_time_left=30.0,
                awaiting_download=1,
                soonest_expiry=cli_now - timedelta(minutes=3, seconds=1),
            )
        )
    )
    bar = lines[0]
    assert bar.startswith("batch ")
    assert "━" in bar
    assert bar.endswith("3/10  0.5 lines/s  eta 14 s  credits 12, cost 0.03")
    header = next(i for i, line in enumerate(lines) if "pending" in line)
    assert header > 0
    assert lines[header].split() == ["pending", "running", "downloading", "succeeded", "failed"]
    assert lines[-3:] == [
        "elapsed 6 s",
        "budget 2 submits/s; the 5 lines left need at least 30 s",
        "awaiting download 1, soonest expiry 3 min ago",
    ]


@pytest.mark.parametrize("quiet", [False, True])
def test_links_at_risk_are_warned_about_once(
    capsys: pytest.CaptureFixture[str], quiet: bool
) -> None:
    with batch_display(Output(Globals(quiet=quiet))) as on_progress:
        for at_risk in (0, 3, 5, 0, 2):
            on_progress(progress(at_risk=at_risk))
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("warning:")] == [AT_RISK.format(n=3)]
    assert len(err) == (1 if quiet else 2)  # and, without --quiet, the first progress line


@pytest.mark.slow
def test_batch_on_a_terminal_draws_the_bar(tmp_path: Path) -> None:
    """The real command, its stderr a pseudo-terminal: rich draws the bar there."""
    source = tmp_path / "in.txt"
    source.write_text("a cat\na dog\na fox\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")}
    code, out, drawn = on_a_terminal(
        ["batch", str(source), "-o", str(tmp_path / "out"), "--mock"], env
    )
    assert code == 0
    assert out.strip() == str(tmp_path / "out" / "manifest.jsonl")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)  # styles
    assert re.search(r"batch [━╸╺]+ *[0-3]/3  [0-9.]+ lines/s  eta ", text)  # the bar's row
    assert "pending" in text  # the counts under it
    assert "batch summary" in text


def test_importing_the_display_stays_cheap() -> None:
    """Its states come from the ledger, imported when a view is drawn: importing the display
    loads no batch machinery (tenacity, sqlite3, the async client)."""
    code = (
        "import sys\n"
        "import imggw_cli._batch_run\n"
        "sys.exit(1 if 'imggw_client.batch' in sys.modules else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
