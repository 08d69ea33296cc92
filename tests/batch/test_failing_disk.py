"""A disk that fails mid-run: `imggw batch` under a file-size limit (writes past it fail as on
a full disk) says what happened in one line, exits 4 at once (local write failures are not
retried as if they were network faults), and the same command resumes once there is room."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imggw_client.mock import MockGateway

KEY = "sk-disk-key-0042"
# Runs the CLI with writes past LIMIT bytes failing (EFBIG, as ENOSPC would) instead of killing.
RUN = (
    "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "limit = int(sys.argv.pop(1)); resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); "
    "from imggw_cli import main; sys.argv[0] = 'imggw'; main()"
)


# Seconds a test: `imggw batch` in processes of its own under a file-size limit (the slow lane, tests/conftest.py).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.gateway(api_keys=[KEY], duration_min=0.02, duration_max=0.05, result_size=300_000),
]


def imggw(limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")}
    return subprocess.run(
        [sys.executable, "-c", RUN, str(limit), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "IMGGW_API_KEY": KEY},
        check=False,
    )


def test_a_disk_too_full_for_the_results_stops_at_once_in_one_line(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    with gateway.serve() as url:
        done = imggw(200_000, "batch", str(source), "-o", str(out), "--base-url", url)
        assert done.returncode == 4, done.stderr
        # Stopped at once, not retried until a deadline (there is none here): no result was
        # fetched twice.
        assert gateway.stats()["requests"]["GET /results/{token}"] <= 3
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, done.stderr
        assert "File too large" in errors[0]
        assert "run the same command to resume" in errors[0]
        assert "Traceback" not in done.stderr
        assert gateway.stats()["tasks_created"] == 3
        # Room again: the same command resumes, and bills nothing twice.
        again = imggw(10**9, "batch", str(source), "-o", str(out), "--base-url", url)
        assert again.returncode == 0, again.stderr
    assert gateway.stats()["tasks_created"] == 3
    assert len(list(out.glob("*.png"))) == 3


def test_a_ledger_that_cannot_grow_is_one_line_too(gateway: MockGateway, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(json.dumps({"prompt": "x" * 2000 + str(i)}) + "\n" for i in range(40))
    )
    with gateway.serve() as url:
        done = imggw(16_384, "batch", str(source), "-o", str(tmp_path / "out"), "--base-url", url)
    assert done.returncode == 4, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "run the same command to resume" in errors[0]
    assert "Traceback" not in done.stderr
    assert gateway.stats()["requests"] == {}  # it failed while planning: nothing was sent
