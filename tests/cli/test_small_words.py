"""The shell's small words (DESIGN 23): IMGGW_SURFACE in either case, ``submit -q`` for
``id=$(imggw submit -q ...)``, a task id asked on the surface the journal recorded it on, help
text without RST markup, and bad values reported without pydantic's prefix."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from imggw_cli._app import app
from imggw_client.mock import MockGateway

from .helpers import IMGGW, imggw, process_env


@pytest.mark.parametrize(
    ("env", "args", "surface"),
    [
        ({"IMGGW_SURFACE": "ALPHA"}, [], "alpha"),
        ({"IMGGW_SURFACE": "Alpha"}, [], "alpha"),
        ({}, ["--surface", "ALPHA"], "alpha"),
        ({"IMGGW_SURFACE": "alpha"}, ["--surface", "BETA"], "beta"),
    ],
)
def test_the_surface_takes_either_case_from_the_environment_or_the_option(
    env: dict[str, str], args: list[str], surface: str
) -> None:
    sent = imggw("submit", "a fox", "--mock", "--json", *args, env=env)
    assert sent.code == 0, sent.err
    assert sent.records()[0]["surface"] == surface


def test_submit_q_prints_the_bare_task_id(served_gateway: tuple[MockGateway, str]) -> None:
    _, url = served_gateway
    sent = imggw("submit", "-q", "a fox", "--base-url", url)
    assert sent.code == 0, sent.err
    task_id = sent.out.removesuffix("\n")
    assert sent.out == f"{task_id}\n"
    assert task_id.isdigit()
    assert sent.err == ""
    assert imggw("status", task_id, "--base-url", url).code == 0
    # --json stays the record it was, -q or not
    record = imggw("submit", "-q", "--json", "a fox", "--base-url", url).records()[0]
    assert set(record) == {"task_id", "idempotency_key", "surface"}
    plain = imggw("submit", "a fox", "--base-url", url).out.splitlines()
    assert [line.split(": ")[0] for line in plain] == ["task_id", "idempotency_key", "surface"]


def _task_id_command(name: str, task_id: str, out: Path) -> list[str]:
    return {
        "status": ["status", task_id],
        "poll": ["poll", task_id],
        "download": ["download", task_id, "--wait", "-o", str(out)],
    }[name]


@pytest.mark.parametrize("command", ["status", "poll", "download"])
def test_a_task_id_is_asked_on_the_surface_the_journal_recorded(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, command: str
) -> None:
    _, url = served_gateway
    sent = imggw("submit", "a fox", "--surface", "alpha", "--base-url", url, "--json")
    task_id = sent.records()[0]["task_id"]
    found = imggw(*_task_id_command(command, task_id, tmp_path / "a"), "--base-url", url, "--json")
    assert found.code == 0, found.err
    (record,) = found.records()
    assert record["task_id"] == task_id
    # A surface chosen, by the option or the environment, is the one asked.
    for chosen, env in ((["--surface", "beta"], {}), ([], {"IMGGW_SURFACE": "beta"})):
        asked = imggw(
            *_task_id_command(command, task_id, tmp_path / "b"), "--base-url", url, *chosen, env=env
        )
        assert asked.code == 1, asked.err
        assert f"No such task. (task_not_found) at {url} on surface beta" in asked.err


def _commands(command: Any, path: list[str]) -> Iterator[list[str]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, [*path, name])


def test_no_help_shows_rst_markup() -> None:
    paths = list(_commands(typer.main.get_command(app), []))
    assert ["tasks", "collect"] in paths
    assert ["mock", "serve"] in paths
    for path in paths:
        shown = imggw(*path, "--help")
        assert shown.code == 0, (path, shown.err)
        assert "``" not in shown.out, path
    collect = " ".join(imggw("tasks", "collect", "--help").out.split())
    assert "as <task id>-<n>.<ext>, as generate saves them" in collect


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (
            ["generate", "x", "-a", "7:5"],
            {},
            "Invalid value for '--aspect-ratio' / '-a': '7:5' is not one of 'auto', '1:1'",
        ),
        (
            ["status", "1", "--surface", "gamma"],
            {},
            "Invalid value for '--surface' (env var: "
            "'IMGGW_SURFACE'): 'gamma' is not one of 'alpha', 'beta'.",
        ),
        (
            ["status", "1"],
            {"IMGGW_SURFACE": "gamma"},
            "Invalid value for '--surface' (env var: "
            "'IMGGW_SURFACE'): 'gamma' is not one of 'alpha', 'beta'.",
        ),
        (
            ["completion", "tcsh"],
            {},
            "Invalid value for 'shell': 'tcsh' is not one of 'bash', 'zsh', 'fish'.",
        ),
    ],
)
def test_a_bad_value_is_said_without_pydantics_prefix(
    args: list[str], env: dict[str, str], says: str
) -> None:
    bad = imggw(*args, "--mock", env=env) if args[0] == "generate" else imggw(*args, env=env)
    assert bad.code == 2
    assert bad.out == ""
    assert f"Error: {says}" in bad.err
    assert "Value error" not in bad.err


@pytest.mark.slow
def test_a_bad_value_is_said_without_pydantics_prefix_in_json_too() -> None:
    done = subprocess.run(
        [*IMGGW, "--log-format", "json", "generate", "x", "-r", "8k"],
        env=process_env("unused"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = [json.loads(text) for text in done.stderr.splitlines()]
    assert (line["event"], line["message"]) == (
        "usage_error",
        "Error: Invalid value for '--resolution' / '-r': '8k' is not one of '1k', '2k', '4k'.",
    )
