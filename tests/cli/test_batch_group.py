"""``imggw batch``: the batch command and its subcommands ``merge`` and ``status`` in one
group. Its first argument names a subcommand only when it is ``merge`` or ``status``; anything
else is the batch command's FILE (a file named ``merge`` is ``./merge``). Global options work
before or after the command name, as everywhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .helpers import imggw


@pytest.fixture
def done(tmp_path: Path) -> Path:
    """A batch folder: one line succeeded, one failed."""
    source = tmp_path / "in.txt"
    source.write_text("a cat\na dog #fail\n")
    out = tmp_path / "done"
    run = imggw("batch", str(source), "-o", str(out), "--mock", "-q")
    assert run.code == 1, run.err
    assert run.out == f"{out / 'manifest.jsonl'}\n"
    return out


@pytest.mark.parametrize("where", ["before", "after"])
def test_status_takes_json_before_or_after_the_command_name(done: Path, where: str) -> None:
    args = ["--json", "batch", "status", str(done)]
    if where == "after":
        args = ["batch", "status", str(done), "--json"]
    run = imggw(*args)
    assert run.code == 1  # some lines failed
    assert run.err == ""
    assert json.loads(run.out) == {
        "total": 2,
        "bad": 0,
        "shards": [],
        "counts": {"pending": 0, "running": 0, "succeeded": 1, "failed": 1},
        # both tasks were charged at submit: 4 credits a 1k task
        "spent": {"credits": 8.0, "cost": 0.02},
        "stopped_by": None,
        "expired": 0,
        "active": False,
        "soonest_expiry": None,
        "resume": None,
    }


def test_status_for_people(done: Path) -> None:
    run = imggw("batch", "status", str(done))
    assert (run.code, run.out) == (
        1,
        "2 lines: 0 pending, 0 running, 1 succeeded, 1 failed, "
        "0 expired\nspent: 8 credits, cost 0.02\n"
        "active: no run holds the folder now\n",
    )


def test_a_file_named_merge_is_given_as_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("merge").write_text("a cat\n")
    subcommand = imggw("batch", "merge", "-o", "out", "--mock", "-q")
    assert subcommand.code == 2
    assert subcommand.err.endswith("Error: No such option: -o\n")
    assert subcommand.err.startswith("Usage: imggw batch merge [OPTIONS]")
    assert not Path("out").exists()
    as_file = imggw("batch", "./merge", "-o", "out", "--mock", "-q")
    assert as_file.code == 0, as_file.err
    assert as_file.out == "out/manifest.jsonl\n"


@pytest.mark.slow
def test_merge_writes_the_manifest_of_the_shards(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a cat\na dog\na fox\n")
    out = tmp_path / "sharded"
    for index in ("1/2", "2/2"):
        shard = imggw("batch", str(source), "-o", str(out), "--shard", index, "--mock", "-q")
        assert shard.code == 0, shard.err
    merged = imggw("--json", "batch", "merge", str(out), "--title", "three")
    assert merged.code == 0, merged.err
    assert [r["line"] for r in merged.records()] == [1, 2, 3]
    assert {r["status"] for r in merged.records()} == {"succeeded"}
    assert "merged 2 shard(s): 3 succeeded" in merged.err


def test_options_of_the_batch_command_come_before_or_after_file(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a cat\n")
    run = imggw("batch", "-o", str(tmp_path / "out"), "--mock", "-q", "-c", "2", str(source))
    assert run.code == 0, run.err
    extra = imggw("batch", str(source), "extra", "-o", str(tmp_path / "out"), "--mock")
    assert extra.code == 2
    assert "Got unexpected extra argument(s) (extra)" in extra.err


def test_help_shows_the_batch_command_and_names_its_subcommands() -> None:
    text = imggw("batch", "--help").out
    assert text.startswith("Usage: imggw batch [OPTIONS] ")
    assert "COMMAND" not in text.splitlines()[0]
    for option in ("--output", "--shard", "--engine", "--json", "--mock"):
        assert option in text
    assert "imggw batch merge DEST" in text
    assert "imggw batch status DEST [--json]" in " ".join(text.split())
    for name in ("merge", "status"):
        usage = imggw("batch", name, "--help").out.splitlines()[0]
        assert usage.startswith(f"Usage: imggw batch {name} [OPTIONS] ")
    root = imggw("--help").out
    assert "batch merge" not in root
    assert re.search(r"^  batch +Generate every line of FILE exactly once", root, re.MULTILINE)


def test_without_file_the_batch_command_says_what_is_missing() -> None:
    run = imggw("batch")
    assert run.code == 2
    assert run.err.startswith("Usage: imggw batch [OPTIONS] ")
    assert "Missing argument" in run.err
