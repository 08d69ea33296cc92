"""Crash safety for real: the gateway runs as its own process (`imggw mock serve`), `imggw
batch` runs as a subprocess and is SIGKILLed three times (mid-submit, then twice mid-download,
each when the gateway's counters show the run got there), with lost answers among the faults,
then run again until done. Exactly 200 tasks billed; 200 files matching the manifest and the
bytes the gateway serves."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

# Seconds a test: a gateway process and a batch SIGKILLed three times (the slow lane, tests/conftest.py).
pytestmark = pytest.mark.slow


KEY = "sk-batch-crash-key-01"
IMGGW = [sys.executable, "-m", "imggw_cli"]
LINES = 200

# The gateway_process these crash tests run against: tasks of up to a second, a fifth of the
# answers faulty.
FAULTY = {
    "api_keys": [KEY],
    "seed": 21,
    "duration_min": 0.2,
    "duration_max": 1.0,
    "fault_rate": 0.2,
    "faults": ["lost", "reset", "latency", "429", "503", "malformed"],
    "latency": 0.3,
    "retry_after": 0,
}


def env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")}
    return {**base, "IMGGW_API_KEY": KEY, "PYTHONUNBUFFERED": "1"}


def stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/_mock/stats").json()  # type: ignore[no-any-return]


def results_fetched(url: str) -> int:
    return sum(n for route, n in stats(url)["requests"].items() if "/results/" in route)


def created(url: str, count: int) -> Callable[[], bool]:
    return lambda: stats(url)["tasks_created"] >= count


def fetched_more(url: str, count: int) -> Callable[[], bool]:
    """True once ``count`` more results were fetched than now: a run downloading."""
    start = results_fetched(url)
    return lambda: results_fetched(url) >= start + count


def kill_when(child: subprocess.Popen[bytes], reached: Callable[[], bool]) -> None:
    """SIGKILLs ``child`` as soon as ``reached()`` holds; it must still be running then, so
    every run the test means to kill is killed."""
    deadline = time.monotonic() + 120
    while not reached():
        assert child.poll() is None, "the run ended before the point it was to be killed at"
        assert time.monotonic() < deadline, "the run never got to the point to kill it at"
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, "the run ended before the kill landed"


def ledger_rows(folder: Path) -> list[tuple[str | None, str, str]]:
    # closing(): a connection's own `with` only commits; it never closes (Python 3.13 warns).
    with closing(sqlite3.connect(folder / "ledger.sqlite")) as db:
        return list(db.execute("SELECT task_id, state, urls FROM tasks"))


def fetch(url: str) -> bytes:
    """The bytes the gateway serves for a result, past its injected faults."""
    for _ in range(50):
        try:
            answer = httpx.get(url, timeout=5)
        except httpx.HTTPError:
            continue
        if answer.status_code == 200 and len(answer.content) == int(
            answer.headers["content-length"]
        ):
            return answer.content
    raise AssertionError(f"could not fetch {url}")


@pytest.mark.gateway(**FAULTY)
def test_sigkill_mid_submit_and_mid_download_never_bills_twice_nor_loses_an_image(
    gateway_process: str, tmp_path: Path
) -> None:
    url = gateway_process
    source = tmp_path / "prompts.jsonl"
    source.write_text(
        "".join(
            json.dumps({"prompt": f"image {i}", "aspect_ratio": "3:2", "id": f"n{i}"}) + "\n"
            for i in range(LINES)
        )
    )
    out = tmp_path / "out"
    command = [*IMGGW, "batch", str(source), "-o", str(out), "--base-url", url, "-c", "8", "-q"]
    # Mid-submit for sure (once the gateway has made some tasks), then twice while results are
    # being saved: each run is killed where the gateway's counters show it got, so all three
    # kills land, whatever the machine's speed.
    points = [(created, 10), (fetched_more, 15), (fetched_more, 15)]
    unknown_after_first_kill = None
    for attempt, (point, count) in enumerate(points):
        reached = point(url, count)  # counted from before this run starts
        child = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env()
        )
        kill_when(child, reached)
        if attempt == 0:
            known = sum(1 for task_id, _, _ in ledger_rows(out) if task_id)
            created_now = stats(url)["tasks_created"]
            unknown_after_first_kill = created_now - known  # made by the gateway, not in the ledger
    final = None
    for _ in range(5):  # run again until every line is finished
        final = subprocess.run(
            [*command[:-1], "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env(),
            check=False,
        )
        if final.returncode != 3:
            break
    assert final is not None
    assert final.returncode == 0, final.stderr[-2000:]
    # The first kill struck mid-submit: the gateway had made tasks the ledger did not know.
    assert unknown_after_first_kill is not None
    assert unknown_after_first_kill > 0

    after = stats(url)
    assert after["tasks_created"] == LINES  # billed exactly once per line
    assert sum(b["tasks"] for b in after["billing"].values()) == LINES
    records = [json.loads(line) for line in final.stdout.splitlines()]
    assert len(records) == LINES
    assert records == [
        json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()
    ]
    assert len({r["task_id"] for r in records}) == LINES
    urls = {task_id: json.loads(raw)[0] for task_id, _, raw in ledger_rows(out)}
    for record in records:
        assert record["status"] == "succeeded"
        (file,) = record["files"]
        content = (out / file["path"]).read_bytes()
        assert hashlib.sha256(content).hexdigest() == file["sha256"]
        assert hashlib.sha256(fetch(urls[record["task_id"]])).hexdigest() == file["sha256"]
    assert len(list(out.glob("*.png"))) == LINES
    assert list(out.glob(".*.part")) == []
