"""``imggw batch status`` for an operator (DESIGN 21): whether a run holds the folder, the
soonest expiry of a result not saved yet, expired apart from failed, and the command that
resumes; only the global options it uses."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

from imggw_client.batch._schema import EXPIRED, LEDGER_NAME, RUNNING, SAVED

from ..batch.ledgers import planned, row
from .helpers import imggw


def folder(tmp_path: Path, surface: str = "beta") -> Path:
    out = tmp_path / "out dir"
    rows = [
        row(1, SAVED, task_id="1", files=["1-0.png"], surface=surface),
        row(
            2,
            EXPIRED,
            task_id="2",
            error_code="result_expired",
            error_message="gone",
            surface=surface,
        ),
        row(3, RUNNING, task_id="3", expires_at=1_900_000_000.0, surface=surface),
    ]
    with planned(out, rows):
        (out / "run.json").write_text(f'{{"format": 1, "run_id": "r", "surface": "{surface}"}}')
    return out


def test_status_says_what_an_operator_acts_on(tmp_path: Path) -> None:
    out = folder(tmp_path)
    run = imggw("batch", "status", str(out), "--json")
    assert run.code == 3, run.err
    record = json.loads(run.out)
    assert record["counts"] == {"pending": 0, "running": 1, "succeeded": 1, "failed": 0}
    assert record["expired"] == 1
    assert record["active"] is False
    assert record["soonest_expiry"] == "2030-03-17T17:46:40Z"
    assert record["resume"] == f"imggw batch FILE -o '{out}'"
    text = imggw("batch", "status", str(out)).out
    assert "1 expired" in text
    assert "soonest expiry of a result not saved yet: 2030-03-17T17:46:40Z" in text
    assert f"resume: imggw batch FILE -o '{out}'" in text


def test_status_resumes_a_run_on_the_surface_it_was_made_on(tmp_path: Path) -> None:
    """A run again on another surface is refused: the command named passes the run's own."""
    out = folder(tmp_path, surface="alpha")
    run = imggw("batch", "status", str(out), "--json")
    assert run.code == 3, run.err
    assert json.loads(run.out)["resume"] == f"imggw batch FILE -o '{out}' --surface alpha"


def test_status_lists_only_the_options_it_uses() -> None:
    text = imggw("batch", "status", "--help").out
    for flag in ("--rate", "--query-rate", "--rate-store", "--mock", "--base-url", "--surface"):
        assert flag not in text, flag
    assert "Example: imggw batch status" in " ".join(text.split())


def test_the_batch_commands_help_shows_an_example() -> None:
    for command in (["batch"], ["batch", "merge"]):
        text = " ".join(imggw(*command, "--help").out.split())
        assert "Example: imggw batch" in text, command


def test_mock_serve_help_shows_an_example() -> None:
    import subprocess

    from .helpers import IMGGW, process_env

    done = subprocess.run(
        [*IMGGW, "mock", "serve", "--help"],
        env=process_env("unused"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "Example: imggw mock serve --port 8080" in done.stdout


def test_status_and_merge_of_a_folder_whose_ledger_has_a_row_no_run_wrote_say_so(
    tmp_path: Path,
) -> None:
    # They read up to that row and printed the rest as pending (exit 3): a run that looked
    # unfinished, where its ledger was damaged.
    out = folder(tmp_path)
    with contextlib.closing(sqlite3.connect(out / LEDGER_NAME)) as db:
        db.execute("UPDATE tasks SET state='bogus' WHERE line=2")
        db.commit()
    for command in (["status"], ["merge"]):
        run = imggw("batch", *command, str(out), "--json")
        assert run.code == 4, run.err
        assert run.out == ""
        assert "(ledger_damaged)" in run.err
        assert "its row 'line:2'" in run.err
    assert not (out / "manifest.jsonl").exists()
