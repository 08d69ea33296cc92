"""IMGGW_LOG on the command line: the SDK's records at that level, written once by the command
(sanitized, in its log format), never the key."""

from __future__ import annotations

import subprocess

import pytest

from .helpers import CANARY, IMGGW, process_env


@pytest.mark.slow
def test_imggw_log_debug_shows_each_sdk_record_once_without_the_key() -> None:
    env = process_env(CANARY, IMGGW_LOG="debug")
    done = subprocess.run(
        [*IMGGW, "status", "1", "--mock"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1  # --mock: a fresh gateway knows no task 1
    lines = [line for line in done.stderr.splitlines() if "imggw_client" in line]
    assert len(lines) == 1, done.stderr
    assert "GET /beta/v1/tasks/1 -> 404" in lines[0]
    assert CANARY not in done.stderr
    quiet = subprocess.run(
        [*IMGGW, "status", "1", "--mock"],
        env=process_env(CANARY),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "imggw_client" not in quiet.stderr
