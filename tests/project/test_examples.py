"""Every example runs, as a user would run it, against the reference gateway on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imggw_client.mock import MockGateway

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KEY = "sk-example-key-0123"
# Seconds a test: each example in a process of its own (the slow lane, tests/conftest.py).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.gateway(api_keys=[KEY], duration_min=0.05, duration_max=0.3),
]


def run(script: str, *args: str, url: str, key: str = KEY) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "IMGGW_API_KEY": key, "IMGGW_BASE_URL": url}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=False,
    )


def test_sync_generate(served_gateway: tuple[MockGateway, str], tmp_path: Path) -> None:
    gw, url = served_gateway
    done = run("sync_generate.py", "a lighthouse", "--out", str(tmp_path), url=url)
    assert done.returncode == 0, done.stderr
    assert "succeeded; credits 8.0" in done.stdout
    assert len(list(tmp_path.glob("*.png"))) == 1
    assert gw.stats()["tasks_created"] == 1


def test_async_many(served_gateway: tuple[MockGateway, str], tmp_path: Path) -> None:
    gw, url = served_gateway
    gw.configure(fault_rate=0.2, faults=["503", "lost", "latency"], latency=0.05, retry_after=0)
    done = run(
        "async_many.py", "--count", "12", "--concurrency", "4", "--out", str(tmp_path), url=url
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(done.stdout.splitlines()) == 12
    assert len(list(tmp_path.glob("*.png"))) == 12
    assert gw.stats()["tasks_created"] == 12  # faults, yet exactly once


def test_custom_http_client(served_gateway: tuple[MockGateway, str]) -> None:
    _, url = served_gateway
    done = run("custom_http_client.py", "a red fox", url=url)
    assert done.returncode == 0, done.stderr
    assert "succeeded" in done.stdout
    assert "-> POST /beta/v1/images/generations" in done.stderr
    assert KEY not in done.stdout + done.stderr


def test_errors_and_resume_waits_again_on_the_same_task() -> None:
    gw = MockGateway(api_keys=[KEY], duration_min=1.5, duration_max=1.5)
    with gw.serve() as url:
        done = run("errors_and_resume.py", "a lighthouse", "--first-wait", "0.3", url=url)
    assert done.returncode == 0, done.stderr
    assert "waiting on task 1" in done.stderr
    assert done.stdout.strip() == "1 succeeded"
    assert gw.stats()["tasks_created"] == 1  # resumed, never resubmitted


@pytest.mark.parametrize(
    ("prompt", "key", "code", "says"),
    [
        ("a cat #fail:nsfw", KEY, 1, "the task failed: nsfw"),
        ("   ", KEY, 2, "fix the request: prompt"),
        ("a cat", "wrong-key", 4, "check IMGGW_API_KEY"),
    ],
)
def test_errors_and_resume_reports_each_outcome(
    served_gateway: tuple[MockGateway, str], prompt: str, key: str, code: int, says: str
) -> None:
    _, url = served_gateway
    done = run("errors_and_resume.py", prompt, url=url, key=key)
    assert done.returncode == code, done.stderr
    assert says in done.stderr


def test_quickstart_saves_a_real_png(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "a red fox", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (png,) = tmp_path.glob("*.png")
    content = png.read_bytes()
    assert content.startswith(b"\x89PNG\r\n\x1a\n")
    assert int.from_bytes(content[16:20], "big") == 512  # 16:9 at 512 px
    assert int.from_bytes(content[20:24], "big") == 288
    assert f"saved {png}" in done.stdout
    assert "succeeded 100%" in done.stdout
