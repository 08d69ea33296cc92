"""The imggw command as a real process: the installed entry point, Ctrl-C mid-poll, and the
gateway started with `imggw mock serve`."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from imggw_client.mock import MockGateway

from .helpers import IMGGW, process_env

CANARY = "sk-canary-proc-2b4d6f8a0c1e"


def env(**extra: str) -> dict[str, str]:
    return process_env(CANARY, **extra)


def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*IMGGW, *args], capture_output=True, text=True, timeout=120, env=env(**extra), check=False
    )
    assert CANARY not in done.stdout + done.stderr
    return done


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "imggw"
    assert script.exists()
    done = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0
    assert done.stdout.startswith("imggw ")


@pytest.mark.slow
def test_generate_mock_in_a_real_process(tmp_path: Path) -> None:
    done = run("generate", "a lighthouse", "--mock", "--json", "-o", str(tmp_path))
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    path = Path(record["files"][0]["path"])
    assert path.read_bytes().startswith(b"\x89PNG")
    assert "succeeded" in done.stderr  # progress lines on stderr when it is not a terminal


@pytest.fixture
def slow_gateway(
    make_gateway: Callable[..., MockGateway], serve_gateway: Callable[[MockGateway], str]
) -> tuple[MockGateway, str]:
    gateway = make_gateway(api_keys=[CANARY], duration_min=60, duration_max=60)
    return gateway, serve_gateway(gateway)


@pytest.mark.slow
def test_ctrl_c_mid_poll_names_the_task_and_exits_130(
    slow_gateway: tuple[MockGateway, str],
) -> None:
    _, url = slow_gateway
    task_id = json.loads(run("submit", "a cat", "--base-url", url, "--json").stdout)["task_id"]
    child = subprocess.Popen(
        [*IMGGW, "poll", task_id, "--base-url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert child.stderr is not None
    first = child.stderr.readline()  # the first progress line: the poll is under way
    assert f"task {task_id}: pending" in first
    time.sleep(0.3)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 130
    assert out == ""
    assert f"imggw poll {task_id} --surface beta" in err
    assert "Traceback" not in err
    assert CANARY not in out + err


@pytest.mark.slow
def test_ctrl_c_while_a_batch_reads_an_idle_pipe_ends_it_at_once(tmp_path: Path) -> None:
    # The plan's thread waited in the pipe's read, and the process with it, until the writer
    # wrote again or closed: Ctrl-C said "interrupted" and went on waiting.
    out = tmp_path / "out"
    with subprocess.Popen(
        [*IMGGW, "batch", "-", "-o", str(out), "--mock"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    ) as child:
        assert child.stdin is not None
        assert child.stderr is not None
        try:
            child.stdin.write("a cat\n")
            child.stdin.flush()
            for _ in range(3000):  # the plan is under way once it writes its input's record
                if list(out.glob(".lines.fp.*.part")):
                    break
                time.sleep(0.01)
            else:
                pytest.fail("the plan never started")
            child.send_signal(signal.SIGINT)
            assert child.wait(timeout=30) == 130  # the pipe still open, nothing more written
            err = child.stderr.read()
        finally:
            child.kill()
    assert "interrupted" in err
    assert "Fatal Python error" not in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_mid_generate_names_the_task(
    slow_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gateway, url = slow_gateway
    child = subprocess.Popen(
        [*IMGGW, "generate", "a cat", "--base-url", url, "-o", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert child.stderr is not None
    child.stderr.readline()
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 130
    # poll would only wait: the command named also saves the result, and makes no new task
    assert f"Resume with: imggw download 1 --wait --surface beta -o {tmp_path}" in err
    assert gateway.stats()["tasks_created"] == 1


def with_default_stop_signals() -> None:
    """A child's start, as a terminal's shell starts a command: SIGTERM and SIGHUP at their
    defaults. An ignored signal stays ignored through fork and exec, and a test run started by
    `nohup` (or by a runner that ignores SIGHUP) would hand its ignored SIGHUP to every command
    it starts, which leaves it ignored, as nohup asks: a SIGHUP sent to it then does nothing."""
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


@pytest.mark.parametrize(("sent", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
@pytest.mark.slow
def test_sigterm_and_sighup_mid_generate_are_handled_as_ctrl_c(
    slow_gateway: tuple[MockGateway, str], tmp_path: Path, sent: signal.Signals, code: int
) -> None:
    """systemd, Kubernetes and `timeout` stop with SIGTERM, a closed terminal sends SIGHUP:
    the task is named with the command that saves its result, as on Ctrl-C."""
    gateway, url = slow_gateway
    # Started here as under `nohup pytest`, whatever this run was started with: the test
    # passes from any runner, and one that let the child inherit the runner's dispositions
    # fails on every machine, not only on those whose runner ignores the signal.
    kept = signal.signal(sent, signal.SIG_IGN)
    try:
        child = subprocess.Popen(
            [*IMGGW, "generate", "a cat", "--base-url", url, "-o", str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
            preexec_fn=with_default_stop_signals,
        )
    finally:
        signal.signal(sent, kept if kept is not None else signal.SIG_DFL)
    assert child.stderr is not None
    # The command takes SIGTERM and SIGHUP over before it submits: once the wait is under way,
    # the signal sent is handled, whenever it arrives.
    assert "task 1: pending" in child.stderr.readline()
    child.send_signal(sent)
    try:
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:  # the signal did not stop it: it would go on waiting
            child.kill()
            child.communicate()
    assert child.returncode == code, err
    assert out == ""
    assert err.splitlines()[-1] == (
        f"error: interrupted by {sent.name}; task 1 goes on. Resume with: "
        f"imggw download 1 --wait --surface beta -o {tmp_path} --base-url {url}"
    )
    assert gateway.stats()["tasks_created"] == 1
    assert CANARY not in out + err


@pytest.mark.slow
def test_a_sighup_ignored_by_nohup_stays_ignored(
    slow_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    """`nohup imggw ...` asks to outlive the terminal: SIGHUP is not taken over, and the
    SIGTERM sent after it is what ends the command."""
    _, url = slow_gateway
    child = subprocess.Popen(
        [*IMGGW, "generate", "a cat", "--base-url", url, "-o", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    assert child.stderr is not None
    assert "task 1: pending" in child.stderr.readline()
    child.send_signal(signal.SIGHUP)  # discarded by the kernel: the process ignores it
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 143, err
    assert "interrupted by SIGTERM; task 1 goes on" in err


def test_a_command_run_in_process_puts_the_signal_handlers_back(
    slow_gateway: tuple[MockGateway, str],
) -> None:
    from .helpers import imggw

    _, url = slow_gateway
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    assert imggw("status", "1", "--base-url", url, env={"IMGGW_API_KEY": CANARY}).code == 1
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.slow
def test_sigterm_mid_download_wait_stops_every_id_and_names_the_one_under_way(
    slow_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gateway, url = slow_gateway
    for prompt in ("a cat", "a dog"):
        assert run("submit", prompt, "--base-url", url).returncode == 0
    child = subprocess.Popen(
        [*IMGGW, "download", "1", "2", "--wait", "--base-url", url, "-o", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert child.stderr is not None
    assert "task 1: pending" in child.stderr.readline()
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 143, err
    assert "interrupted by SIGTERM; task 1 goes on" in err
    assert "task 2" not in err  # the command ended: the next id was not waited on
    assert gateway.stats()["requests"].get("GET /beta/v1/tasks/{id}", 0) >= 1


@pytest.mark.slow
def test_sigterm_mid_batch_writes_the_manifest_and_a_rerun_submits_nothing(
    slow_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gateway, url = slow_gateway
    polled: set[str] = set()
    answer = gateway.handle

    def seen(request: Any) -> Any:
        if request.method == "GET" and "/tasks/" in request.path:
            polled.add(request.path.rsplit("/", 1)[1])
        return answer(request)

    gateway.handle = seen  # type: ignore[method-assign]
    source = tmp_path / "prompts.txt"
    source.write_text("a cat\na dog\na fox\n")
    out = tmp_path / "out"
    command = [
        *IMGGW,
        "--log-format",
        "json",
        "batch",
        str(source),
        "-o",
        str(out),
        "--base-url",
        url,
    ]
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    deadline = time.monotonic() + 60
    # Every line's task was answered and is being waited on: the gateway saw each polled.
    while polled != {"1", "2", "3"}:
        assert time.monotonic() < deadline
        assert child.poll() is None
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    stdout, stderr = child.communicate(timeout=30)
    assert child.returncode == 143, stderr
    assert stdout == ""
    last = json.loads(stderr.splitlines()[-1])
    assert (last["event"], last["exit_code"], last["signal"]) == ("interrupted", 143, "SIGTERM")
    assert last["message"] == (
        "error: interrupted by SIGTERM; every line's progress is saved: run the same command "
        "to resume"
    )
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [(r["line"], r["status"]) for r in rows] == [
        (1, "running"),
        (2, "running"),
        (3, "running"),
    ]
    assert sorted(r["task_id"] for r in rows) == ["1", "2", "3"]
    again = run("batch", str(source), "-o", str(out), "--base-url", url, "-t", "0.5")
    assert again.returncode == 3, again.stderr  # resumed, still running; the lock was freed
    assert gateway.stats()["tasks_created"] == 3  # nothing submitted twice
    assert CANARY not in stdout + stderr


@pytest.mark.parametrize("command", ["submit", "generate"])
@pytest.mark.slow
def test_ctrl_c_mid_submit_prints_a_resubmit_that_bills_nothing_twice(
    command: str, tmp_path: Path
) -> None:
    gateway = MockGateway(api_keys=[CANARY], duration_min=0.05, duration_max=0.1)
    handle = gateway.handle
    slow = [True]

    def answer_late(request: Any) -> Any:  # the task is made; its answer is slow to come
        response = handle(request)
        if request.method == "POST" and slow[0]:
            return dataclasses.replace(response, delay=3.0)
        return response

    gateway.handle = answer_late  # type: ignore[method-assign]
    with gateway.serve() as url:
        child = subprocess.Popen(
            [
                *IMGGW,
                command,
                "a cat",
                "--base-url",
                url,
                "-a",
                "3:2",
                "-o" if command == "generate" else "-r",
                str(tmp_path) if command == "generate" else "2k",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        deadline = time.monotonic() + 30
        while gateway.stats()["tasks_created"] == 0:
            assert time.monotonic() < deadline
            assert child.poll() is None
            time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
        assert child.returncode == 130, err
        assert "interrupted during the submit: a task may have been created" in err
        hint = err.split("resubmit safely (no second task) with: ", 1)[1].split("\n", 1)[0]
        args = hint.split()
        assert args[:3] == ["imggw", command, "PROMPT"]
        assert args[3:9] == [
            "--surface",
            "beta",
            "--aspect-ratio",
            "3:2",
            "--resolution",
            "1k" if command == "generate" else "2k",
        ]
        assert args[9] == "--idempotency-key"
        slow[0] = False
        again = run(
            "submit",
            "a cat",
            "--base-url",
            url,
            "-a",
            "3:2",
            "-r",
            args[8],
            "--idempotency-key",
            args[10],
            "--json",
        )
        assert again.returncode == 0, again.stderr
        assert gateway.stats()["tasks_created"] == 1  # the same task, replayed
        assert gateway.stats()["replays"] == 1
    assert CANARY not in out + err


@pytest.mark.slow
def test_mock_serve_then_commands_against_it(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [
            *IMGGW,
            "mock",
            "serve",
            "--port",
            "0",
            "--api-key",
            CANARY,
            "--duration-min",
            "0",
            "--duration-max",
            "0.2",
            "--fault-rate",
            "0.2",
            "--faults",
            "503,lost,latency",
            "--latency",
            "0.05",
            "--seed",
            "2",
            "--retry-after",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        paths = []
        for i in range(3):
            done = run("generate", f"image {i}", "--base-url", url, "-o", str(tmp_path), "-q")
            assert done.returncode == 0, done.stderr
            paths.append(done.stdout.strip())
        assert len(set(paths)) == 3
        assert all(Path(p).exists() for p in paths)
        stats = httpx.get(f"{url}/_mock/stats").json()
        assert stats["tasks_created"] == 3
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0
    assert CANARY not in err


def test_mock_serve_help_lists_every_gateway_option() -> None:
    done = run("mock", "serve", "--help")
    assert done.returncode == 0
    for option in (
        "--host",
        "--port",
        "--api-key",
        "--seed",
        "--duration-min",
        "--duration-max",
        "--failure-rate",
        "--fault-rate",
        "--faults",
        "--quirks",
        "--retention",
        "--manual-clock",
    ):
        assert option in done.stdout
    assert done.stdout.startswith("Usage: imggw mock serve")
