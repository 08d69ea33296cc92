"""The soak script's short version: every fault kind at 30%, both surfaces, both clients. The
checks are made on the counts it prints with --json; its longer runs are a benchmark
(BENCHMARKS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Seconds a test: the soak script in a process of its own (the slow lane, tests/conftest.py).
pytestmark = pytest.mark.slow


SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
REQUESTS = 80


def test_short_soak_bills_once_loses_nothing_and_verifies_every_file() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--requests",
            str(REQUESTS),
            "--seconds",
            "60",
            "--seed",
            "5",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["requests"] == REQUESTS
    assert summary["billed"] == REQUESTS, summary  # one task per request, none billed twice
    assert summary["billed_per_key"] == REQUESTS, summary
    assert summary["duplicates"] == 0, summary
    assert summary["lost"] == 0, summary["errors"]
    assert summary["errors"] == []
    assert summary["verified"] == REQUESTS, summary  # the bytes the gateway serves, each file
    assert summary["files"] == REQUESTS, summary
    assert sum(summary["faults"].values()) > 0  # it was a soak: faults were met and survived
