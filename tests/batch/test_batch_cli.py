"""`imggw batch` through the CLI: output channels, exit codes, the lock between processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from imggw_cli import _runtime
from imggw_cli._app import app
from imggw_client.mock import MockGateway

from . import MANIFEST_FIELDS

KEY = "sk-batch-cli-key-0042"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"IMGGW_API_KEY": KEY, "IMGGW_BASE_URL": None})
    assert KEY not in result.stdout + result.stderr
    return result.exit_code, result.stdout, result.stderr


def prompts(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.gateway(api_keys=[KEY], duration_min=0.02, duration_max=0.1)
def test_batch_json_writes_the_manifest_records_on_stdout(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: object
) -> None:
    gw, url = served_gateway
    source = prompts(tmp_path / "in.txt", ["a cat", "a dog", "# not this", "a fox"])
    code, out, err = invoke(
        "batch", str(source), "-o", str(tmp_path / "out"), "--base-url", url, "--json"
    )
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["line"] for r in records] == [1, 2, 4]
    assert all(set(r) == MANIFEST_FIELDS for r in records)
    assert [r["prompt"] for r in records] == ["a cat", "a dog", "a fox"]
    assert "batch summary" in err  # the summary goes to stderr
    code, out, _ = invoke("batch", str(source), "-o", str(tmp_path / "out"), "--base-url", url)
    assert code == 0
    assert out.strip() == str(tmp_path / "out" / "manifest.jsonl")
    assert gw.stats()["tasks_created"] == 3


@pytest.mark.slow
@pytest.mark.gateway(api_keys=[KEY], duration_min=0.02, duration_max=0.1)
def test_batch_exit_codes(served_gateway: tuple[MockGateway, str], tmp_path: Path) -> None:
    gw, url = served_gateway
    failing = prompts(tmp_path / "fail.txt", ["ok", "not ok #fail"])
    assert invoke("batch", str(failing), "-o", str(tmp_path / "a"), "--base-url", url, "-q")[0] == 1
    bad = prompts(tmp_path / "bad.jsonl", ['{"prompt": "ok"}', '{"prompt": ""}'])
    code, out, err = invoke("batch", str(bad), "-o", str(tmp_path / "b"), "--base-url", url)
    assert code == 2
    assert "line 2" in err
    assert out == ""
    assert gw.stats()["tasks_created"] == 2  # the bad file sent nothing
    gw.configure(duration_min=5, duration_max=5)
    slow = prompts(tmp_path / "slow.txt", ["slow one"])
    code, _, err = invoke(
        "batch", str(slow), "-o", str(tmp_path / "c"), "--base-url", url, "-t", "0.3"
    )
    assert code == 3
    assert "run the same command again" in err


def test_batch_with_mock_needs_no_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(_runtime.MOCK_SETTINGS, "duration_min", 0.01)
    monkeypatch.setitem(_runtime.MOCK_SETTINGS, "duration_max", 0.1)
    source = prompts(tmp_path / "in.txt", ["a cat", "a dog"])
    code, _, err = invoke("batch", str(source), "-o", str(tmp_path / "out"), "--mock", "-q")
    assert code == 0, err
    assert len(list((tmp_path / "out").glob("*.png"))) == 2


# A task that never finishes (the clock moves only when told): the first run holds the
# folder for as long as the second takes to start, however slow the machine.
@pytest.mark.slow
@pytest.mark.gateway(api_keys=[KEY], manual_clock=True)
def test_a_second_process_is_refused_with_a_clear_message(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    source = prompts(tmp_path / "in.txt", ["slow"])
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")},
        "IMGGW_API_KEY": KEY,
    }
    command = [
        sys.executable,
        "-m",
        "imggw_cli",
        "batch",
        str(source),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        url,
        "-q",
    ]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 20
        while gw.stats()["tasks_created"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=60, check=False
        )
    finally:
        first.kill()
        first.wait(timeout=30)
    assert second.returncode == 2
    assert "another batch is running" in second.stderr
    assert gw.stats()["tasks_created"] == 1
