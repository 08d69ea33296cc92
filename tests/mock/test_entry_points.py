"""What users run: the pytest fixtures, and ``python -m imggw_client.mock`` as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from imggw_client import AsyncClient, Client, TaskStatus
from imggw_client.mock import MockGateway

pytestmark = pytest.mark.anyio


def test_the_client_fixture(
    imggw_client: Client, imggw_gateway: MockGateway, tmp_path: Path
) -> None:
    task = imggw_client.generate("a lighthouse")
    assert task.status is TaskStatus.SUCCEEDED
    assert imggw_client.download(task, tmp_path)[0].path.exists()
    assert imggw_gateway.stats()["tasks_created"] == 1


async def test_the_async_client_fixture(
    imggw_async_client: AsyncClient, imggw_gateway: MockGateway
) -> None:
    task = await imggw_async_client.generate("a lighthouse", surface="alpha")
    assert task.status is TaskStatus.SUCCEEDED
    assert imggw_gateway.stats()["tasks_created"] == 1


@pytest.fixture
def imggw_gateway_options() -> dict[str, Any]:
    return {"fault_rate": 0.3, "seed": 9}


@pytest.mark.slow
def test_options_can_be_overridden(imggw_client: Client, imggw_gateway: MockGateway) -> None:
    for i in range(10):
        imggw_client.generate(f"request {i}")
    stats = imggw_gateway.stats()
    assert stats["tasks_created"] == 10
    assert sum(stats["faults"].values()) > 0


def test_the_url_fixture(imggw_gateway_url: str) -> None:
    assert imggw_gateway_url.startswith("http://127.0.0.1:")
    with Client(api_key="test-key", base_url=imggw_gateway_url) as client:
        assert client.submit("a cat").task_id == "1"


@pytest.mark.slow
def test_python_dash_m_serves_until_interrupted() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "imggw_client.mock",
            "--port",
            "0",
            "--api-key",
            "k-one",
            "--api-key",
            "k-two",
            "--seed",
            "3",
            "--duration-min",
            "0",
            "--duration-max",
            "0.1",
            "--faults",
            "503,lost",
            "--submit-limit",
            "2/60",
            "--quirks",
            "no_retry_after",
            "--link-ttl",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        body = {"model": "imagegen-2", "prompt": "x", "size": "1:1", "resolution": "1k", "n": 1}
        answers = [
            httpx.post(
                f"{url}/beta/v1/images/generations",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            )
            for key in ("k-one", "k-two", "k-one", "k-one")
        ]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]  # two per key in 60 s
        assert "retry-after" not in answers[3].headers  # the quirk took
        stats = httpx.get(f"{url}/_mock/stats").json()
        assert (stats["tasks_created"], stats["rate_limited"]) == (3, 1)
        assert len(stats["billing"]) == 2
    finally:
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=20)
    assert child.returncode == 0
    assert "k-one" not in err
    assert "k-two" not in err
    assert "2 API key(s)" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--failure-rate", "3"], "failure_rate"),
        (["--duration-max", "0.1"], "duration_min (1)"),
        (["--faults", "meteor"], "faults must be some of"),
        (["--submit-limit", "0/10"], "submit_limit must be N/S"),
        (["--link-ttl", "0"], "link_ttl must be > 0"),
        (["--request-timeout", "-1"], "request_timeout must be > 0"),
    ],
)
def test_python_dash_m_refuses_bad_settings(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "imggw_client.mock", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert says in done.stderr
    assert done.stdout == ""


def test_python_dash_m_says_when_the_port_is_taken() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "imggw_client.mock", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert "port in use" in done.stderr
    assert "Traceback" not in done.stderr


# Python imports sitecustomize at start-up from the path: this one makes uvicorn unimportable,
# as it is when the `mock` extra is not installed.
NO_UVICORN = "import sys\nsys.modules['uvicorn'] = None\n"


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "imggw_client.mock", "--port", "0"],
        ["-m", "imggw_cli", "mock", "serve", "--port", "0"],
    ],
)
def test_serving_without_uvicorn_says_what_to_install(command: list[str], tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(NO_UVICORN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.returncode == 4
    assert done.stderr.count("\n") == 1
    assert "pip install 'imggw[mock]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_the_new_settings_are_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "imggw_client.mock", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    for option in (
        "--submit-limit",
        "--query-limit",
        "--link-ttl",
        "--request-timeout",
        "no_retry_after",
    ):
        assert option in done.stdout
