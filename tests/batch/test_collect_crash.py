"""A collect killed for real: the gateway in its own process (`imggw mock serve`, with faults),
`imggw download --from ids --wait` SIGKILLed three times while it saves results (each when the
gateway has served it more of them), then run again until done. Nothing lost, nothing
submitted, and once done a rerun saves nothing again."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import httpx
import pytest

from imggw_client import Client, RetryPolicy

from .test_crash import (
    FAULTY,
    IMGGW,
    KEY,
    env,
    fetched_more,
    kill_when,
    results_fetched,
)

# Seconds a test: a gateway process and a collect SIGKILLed three times (the slow lane, tests/conftest.py).
pytestmark = pytest.mark.slow


TASKS = 120


@pytest.mark.gateway(**FAULTY)
def test_a_collect_killed_mid_download_loses_nothing_and_saves_nothing_twice(
    gateway_process: str,
    tmp_path: Path,
) -> None:
    url = gateway_process
    patient = RetryPolicy(max_attempts=30, initial_backoff=0.01, max_backoff=0.2)
    with Client(api_key=KEY, base_url=url, retry=patient) as client:
        ids = [client.submit(f"made elsewhere {i}").task_id for i in range(TASKS)]
    created = httpx.get(f"{url}/_mock/stats").json()["tasks_created"]
    assert created == TASKS
    source = tmp_path / "ids.txt"
    source.write_text("".join(f"{task_id}\n" for task_id in ids))
    out = tmp_path / "out"
    command = [
        *IMGGW,
        "download",
        "--from",
        str(source),
        "--wait",
        "-o",
        str(out),
        "--base-url",
        url,
        "-c",
        "4",
        "-q",
    ]
    for _ in range(3):  # each kill lands mid-collect: a run that ends first fails the test
        reached = fetched_more(url, 10)
        child = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env()
        )
        kill_when(child, reached)
    final = None
    for _ in range(5):
        final = subprocess.run(
            [*command, "--json"],
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
    stats = httpx.get(f"{url}/_mock/stats").json()
    assert stats["tasks_created"] == TASKS  # collected, never submitted
    records = [json.loads(line) for line in final.stdout.splitlines()]
    assert [r["task_id"] for r in records] == ids
    for record in records:
        (file,) = record["files"]
        content = (out / file["path"]).read_bytes()
        assert hashlib.sha256(content).hexdigest() == file["sha256"]
    assert len(list(out.glob("*.png"))) == TASKS
    assert list(out.glob(".*.part")) == []
    fetched = results_fetched(url)
    again = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=env(), check=False
    )
    assert again.returncode == 0
    assert results_fetched(url) == fetched  # done is done: nothing saved twice
