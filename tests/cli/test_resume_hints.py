"""The commands a message names to go on carry every option they need (DESIGN 23): the folder,
the surface, a base URL typed on the command line, each quoted for a shell, so that the command
runs as pasted."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from imggw_client.mock import MockGateway

from .helpers import imggw


@pytest.fixture
def slow(
    make_gateway: Callable[..., MockGateway], serve_gateway: Callable[[MockGateway], str]
) -> str:
    """A gateway whose tasks run for a minute: every wait here ends before they do."""
    return serve_gateway(make_gateway(duration_min=60, duration_max=60))


def hint(err: str, after: str, before: str = "\n") -> list[str]:
    """The command a message names after ``after``, as a shell splits it."""
    return shlex.split(err.split(after, 1)[1].split(before, 1)[0])


def test_collect_names_its_folder_and_wait(slow: str, tmp_path: Path) -> None:
    assert imggw("submit", "a fox", "--base-url", slow).code == 0
    folder = tmp_path / "my coll"
    left = imggw("tasks", "collect", "-o", str(folder), "--base-url", slow)
    assert left.code == 3, left.err
    assert hint(left.err, "still running: run `", "`") == [
        "imggw",
        "tasks",
        "collect",
        "-o",
        str(folder),
        "--wait",
        "--base-url",
        slow,
    ]


def test_a_base_url_is_named_when_typed_not_when_from_the_environment(slow: str) -> None:
    task_id = imggw("submit", "-q", "a fox", "--base-url", slow).out.strip()
    typed = imggw("poll", task_id, "--timeout", "0", "--base-url", slow)
    assert typed.code == 3, typed.err
    assert hint(typed.err, "resume with: ") == [
        "imggw",
        "poll",
        task_id,
        "--surface",
        "beta",
        "--base-url",
        slow,
    ]
    from_env = imggw("poll", task_id, "--timeout", "0", env={"IMGGW_BASE_URL": slow})
    assert from_env.code == 3, from_env.err
    assert hint(from_env.err, "resume with: ") == ["imggw", "poll", task_id, "--surface", "beta"]


def test_a_task_found_in_the_journal_resumes_on_its_surface(slow: str, tmp_path: Path) -> None:
    task_id = imggw("submit", "-q", "a fox", "--surface", "alpha", "--base-url", slow).out.strip()
    folder = tmp_path / "out dir"
    left = imggw("download", task_id, "--wait", "-t", "0", "-o", str(folder), "--base-url", slow)
    assert left.code == 3, left.err
    assert hint(left.err, "resume with: ") == [
        "imggw",
        "download",
        task_id,
        "--wait",
        "--surface",
        "alpha",
        "-o",
        str(folder),
        "--base-url",
        slow,
    ]


@pytest.mark.gateway(fault_rate=1.0, faults=["lost"])
def test_a_generate_of_unknown_outcome_is_resent_into_its_folder(
    served_gateway: tuple[MockGateway, str], no_backoff: list[float], tmp_path: Path
) -> None:
    _, url = served_gateway
    folder = tmp_path / "my out"
    lost = imggw("generate", "a private prompt", "-a", "16:9", "-o", str(folder), "--base-url", url)
    assert lost.code == 5, lost.err
    words = hint(lost.err, "resubmit safely (no second task) with: ")
    assert words[:9] == [
        "imggw",
        "generate",
        "PROMPT",
        "--surface",
        "beta",
        "--aspect-ratio",
        "16:9",
        "--resolution",
        "1k",
    ]
    assert words[9] == "--idempotency-key"
    assert words[11:] == ["-o", str(folder), "--base-url", url]
    assert "private" not in lost.err


def test_a_shard_names_its_folder_to_merge(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\na dog\n")
    dest = tmp_path / "run out"
    done = imggw("batch", str(prompts), "-o", str(dest), "--shard", "1/2", "--mock")
    assert done.code == 0, done.err
    assert hint(done.err, "when every shard has run: ") == ["imggw", "batch", "merge", str(dest)]
