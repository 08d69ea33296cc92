"""The shell's word (DESIGN 22): a resumed batch keeps the file names its folder records (or
refuses another, naming it) and its resume hint names them and the input; ``batch -q`` still
names failed lines; saved files have one ``--json`` shape in every command; one file-name rule
for a task's results; ``-a 16:<Tab>`` completes in bash."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from imggw_cli._completion import DEFAULT_BREAKS, bash_cut
from imggw_client.batch._schema import RUNNING
from imggw_client.mock import MockGateway

from ..batch.ledgers import planned, row
from .helpers import CANARY, IMGGW, imggw, imggw_batch, process_env


def posts(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if route.startswith("POST"))


def lines_file(tmp_path: Path, *records: dict[str, Any]) -> Path:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    return source


# ---------------------------------------------------------------------------- (a) --name kept


def test_a_resumed_batch_keeps_its_recorded_name_and_refuses_another(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    source = lines_file(tmp_path, {"prompt": "a cat", "id": "cat"})
    out = tmp_path / "out"
    first = imggw(
        "batch", str(source), "-o", str(out), "--name", "{line}-{id}", "--base-url", url, "-q"
    )
    assert first.code == 0, first.err
    recorded = json.loads((out / "run.json").read_text())
    assert (recorded["name"], recorded["input"]) == ("{line}-{id}", str(source))
    with source.open("a") as more:
        more.write(json.dumps({"prompt": "a dog", "id": "dog"}) + "\n")
    again = imggw("batch", str(source), "-o", str(out), "--allow-changes", "--base-url", url, "-q")
    assert again.code == 0, again.err
    assert sorted(p.name for p in out.glob("*.png")) == ["1-cat.png", "2-dog.png"]
    sent = posts(gw)
    other = imggw(
        "batch", str(source), "-o", str(out), "--name", "{task_id}-{index}", "--base-url", url
    )
    assert other.code == 2
    assert other.err == (
        "error: --name '{task_id}-{index}': this folder's run names its files by --name "
        "'{line}-{id}'; run without --name to go on with it, or use another folder; nothing "
        "was sent\n"
    )
    assert posts(gw) == sent


def test_a_folder_made_before_runs_kept_their_name_takes_name_as_given(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    source = lines_file(tmp_path, {"prompt": "a cat", "id": "cat"})
    out = tmp_path / "out"
    assert imggw_batch(source, out, url, "-q").code == 0
    record = json.loads((out / "run.json").read_text())
    del record["name"], record["input"]  # as an earlier version wrote it
    (out / "run.json").write_text(json.dumps(record))
    with source.open("a") as more:
        more.write(json.dumps({"prompt": "a dog", "id": "dog"}) + "\n")
    rerun = imggw(
        "batch",
        str(source),
        "-o",
        str(out),
        "--name",
        "{id}",
        "--allow-changes",
        "--base-url",
        url,
        "-q",
    )
    assert rerun.code == 0, rerun.err
    assert "dog.png" in {p.name for p in out.glob("*.png")}
    assert json.loads((out / "run.json").read_text())["name"] == "{id}"


def test_batch_status_resumes_with_the_recorded_input_and_name(tmp_path: Path) -> None:
    out = tmp_path / "out dir"
    source = tmp_path / "my prompts.jsonl"
    with planned(out, [row(1, RUNNING, task_id="1")]):
        (out / "run.json").write_text(
            json.dumps(
                {
                    "format": 1,
                    "run_id": "r",
                    "surface": "alpha",
                    "name": "{line}-{id}",
                    "input": str(source),
                }
            )
        )
    run = imggw("batch", "status", str(out), "--json")
    assert run.code == 3, run.err
    resume = json.loads(run.out)["resume"]
    assert shlex.split(resume) == [
        "imggw",
        "batch",
        str(source),
        "-o",
        str(out),
        "--surface",
        "alpha",
        "--name",
        "{line}-{id}",
    ]


# ---------------------------------------------------------------------------- (b) -q names failures


def test_batch_q_names_the_failed_lines(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    source = tmp_path / "in.txt"
    source.write_text("a cat\na doomed dog #fail:content_policy\n")
    out = tmp_path / "out"
    run = imggw_batch(source, out, url, "-q")
    assert run.code == 1
    first, last = run.err.splitlines()
    assert first.startswith("warning: line 2 failed (task ")
    assert "content_policy" in first
    assert last == (
        f"warning: 1 line(s) failed: every line's status and error is in {out / 'manifest.jsonl'}"
    )


def test_batch_q_counts_skipped_bad_lines(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a cat"}\n{"prompt": \n')
    out = tmp_path / "out"
    run = imggw("batch", str(source), "-o", str(out), "--skip-bad-lines", "--base-url", url, "-q")
    assert run.code == 1
    assert run.err == (
        f"warning: 1 bad input line(s) skipped: listed in {out / 'manifest.jsonl'}\n"
    )


# ---------------------------------------------------------------------------- (c) one shape


def _shape(records: list[dict[str, Any]]) -> set[tuple[str, ...]]:
    return {tuple(sorted(f)) for r in records for f in r["files"]}


def test_saved_files_have_one_json_shape_in_every_command(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    made = imggw("generate", "a fox", "-o", str(tmp_path / "g"), "--base-url", url, "--json")
    later = imggw("submit", "-q", "a cat", "--base-url", url).out.strip()
    collect_me = imggw("submit", "-q", "a dog", "--base-url", url).out.strip()
    assert imggw("poll", later, "--base-url", url, "--no-journal").code == 0
    got = imggw("download", later, "-o", str(tmp_path / "d"), "--wait", "--base-url", url, "--json")
    ids = tmp_path / "ids.txt"
    ids.write_text(later + "\n")
    listed = imggw(
        "download", "--from", str(ids), "-o", str(tmp_path / "f"), "--base-url", url, "--json"
    )
    collected = imggw(
        "tasks", "collect", "-o", str(tmp_path / "c"), "--wait", "--base-url", url, "--json"
    )
    for run in (made, got, listed, collected):
        assert run.code == 0, run.err
        assert _shape(run.records()) == {("path", "sha256", "size")}, run.out
    assert [r["task_id"] for r in collected.records()] == [collect_me]


# ---------------------------------------------------------------------------- (d) one name rule


def test_a_task_s_files_are_named_by_one_rule(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    """``<task id>-<n>.<ext>`` for a task of the command's surface; a task of the other
    surface (whose ids may be the same) starts with ``<surface>-``."""
    _, url = served_gateway
    made = imggw("generate", "a fox", "-o", str(tmp_path), "--base-url", url, "--json")
    (record,) = made.records()
    assert [Path(f["path"]).name for f in record["files"]] == [f"{record['task_id']}-0.png"]
    alpha = imggw("submit", "-q", "a cat", "--surface", "alpha", "--base-url", url).out.strip()
    got = imggw("download", alpha, "--wait", "-o", str(tmp_path), "--base-url", url, "--json")
    assert got.code == 0, got.err
    (record,) = got.records()  # found in the journal on alpha; the command's surface is beta
    assert [Path(f["path"]).name for f in record["files"]] == [f"alpha-{alpha}-0.png"]
    same = imggw(
        "download",
        alpha,
        "-o",
        str(tmp_path / "a"),
        "--surface",
        "alpha",
        "--base-url",
        url,
        "--json",
    )
    (record,) = same.records()
    assert [Path(f["path"]).name for f in record["files"]] == [f"{alpha}-0.png"]


def test_collect_names_a_task_of_the_command_s_surface_as_generate_does(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    task_id = imggw("submit", "-q", "a fox", "--base-url", url).out.strip()
    collected = imggw(
        "tasks", "collect", "-o", str(tmp_path), "--wait", "--base-url", url, "--json"
    )
    (record,) = collected.records()
    assert [Path(f["path"]).name for f in record["files"]] == [f"{task_id}-0.png"]


# ---------------------------------------------------------------------------- (e) 16:<Tab>


@pytest.mark.parametrize(
    ("incomplete", "kept"),
    [
        ("16:", "16:"),
        ("16:1", "16:"),
        ("1", ""),
        ("--aspect-ratio=16:", "16:"),
        ("", ""),
        ("a=b", "a="),
    ],
)
def test_the_part_of_a_word_bash_keeps(incomplete: str, kept: str) -> None:
    assert bash_cut(incomplete, DEFAULT_BREAKS) == kept


@pytest.mark.slow
def test_bash_completes_an_aspect_ratio_after_its_colon() -> None:
    """As bash calls the script for ``imggw generate x -a 16:<Tab>``: the words broken at the
    colon, the line up to the cursor; the answer is what goes after the colon."""
    bash = shutil.which("bash")
    assert bash is not None
    script = imggw("completion", "bash").out
    cases = {
        ("imggw generate x -a 16:", "imggw generate x -a 16 :", 5): ["9"],
        ("imggw generate x -a 21:", "imggw generate x -a 21 :", 5): ["9"],
        ("imggw generate x -a 1", "imggw generate x -a 1", 4): ["1:1", "16:9", "1:2", "1:3"],
        ("imggw generate x --aspect-ratio=9:", "imggw generate x --aspect-ratio = 9 :", 7): [
            "16",
            "21",
        ],
    }
    program = script + "".join(
        f"\nCOMP_LINE={shlex.quote(line)}; COMP_POINT=${{#COMP_LINE}}; "
        f"COMP_WORDS=({words}); COMP_CWORD={cword}; COMPREPLY=(); _imggw_completion imggw; "
        'printf "%s " "${COMPREPLY[@]}"; echo'
        for line, words, cword in cases
    )
    bin_dir = os.path.dirname(IMGGW[0])
    env = {**process_env("unused"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        [bash, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert [line.split() for line in done.stdout.splitlines()] == list(cases.values())
    assert CANARY not in done.stdout
