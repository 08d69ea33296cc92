"""``--log-format json`` (env ``IMGGW_LOG_FORMAT=json``, DESIGN 17): every stderr line is one
JSON object with ``time``, ``level``, ``event`` and the fields that apply, whatever the command
meets (success, a refused key, a batch, a usage error, ``-v``, Ctrl-C), and stdout is byte for
byte what the text form prints. Real processes against the reference gateway on loopback: the
bytes a log collector would read."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from imggw_cli import _output
from imggw_client.mock import MockGateway

from .helpers import CANARY, IMGGW, imggw, process_env
from .helpers import on_a_terminal as terminal

WRONG = "sk-wrong-key-logs-8f6e4d2c"
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
LEVELS = {"debug", "info", "warning", "error", "critical"}


def env(**extra: str) -> dict[str, str]:
    return process_env(CANARY, **extra)


def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*IMGGW, *args], capture_output=True, text=True, timeout=60, env=env(**extra), check=False
    )
    for secret in (CANARY, WRONG):
        assert secret not in done.stdout + done.stderr, "the API key was printed"
    return done


def objects(stderr: str) -> list[dict[str, Any]]:
    """Every non-empty stderr line as its JSON object, each checked for the fields every line
    has; a line that is not JSON (a traceback, a rich table) fails here."""
    found = []
    for line in stderr.splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        assert isinstance(record, dict), line
        assert STAMP.fullmatch(record["time"]), record
        moment = datetime.fromisoformat(record["time"].replace("Z", "+00:00"))
        assert abs((datetime.now(timezone.utc) - moment).total_seconds()) < 300
        assert record["level"] in LEVELS, record
        assert re.fullmatch(r"[a-z_]+", record["event"]), record
        assert isinstance(record["message"], str), record
        found.append(record)
    return found


def steady(stdout: str) -> str:
    """``stdout`` less the one part that moves with the clock between two runs: how long until
    the links expire (``in 1 d`` a second later reads ``in 23 h 59 min``)."""
    return re.sub(r"links expire in [^(]*\(", "links expire in ... (", stdout)


pytestmark = pytest.mark.gateway(duration_min=0.05, duration_max=0.15)


@pytest.mark.slow
def test_generate_logs_json_objects_and_prints_the_same_stdout(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    # One idempotency key: the second run is the same task (replayed), so its stdout can be
    # compared byte for byte.
    same = [
        "generate",
        "a cat",
        "--base-url",
        url,
        "-o",
        str(tmp_path),
        "--overwrite",
        "--idempotency-key",
        "log-format-generate-1",
    ]
    for data in ([], ["--json"]):
        text = run(*same, *data)
        logged = run("--log-format", "json", *same, *data)
        assert (text.returncode, logged.returncode) == (0, 0), logged.stderr
        assert logged.stdout == text.stdout
        records = objects(logged.stderr)
        progress = [r for r in records if r["event"] == "progress"]
        assert progress, logged.stderr
        task_id = progress[0]["task_id"]
        assert all(r["task_id"] == task_id and r["level"] == "info" for r in progress)
        assert progress[-1]["status"] == "succeeded"
        assert progress[-1]["message"].startswith(f"task {task_id}: succeeded 100%")
        expiry = next(r for r in records if r["event"] == "links_expire")
        assert expiry["task_id"] == task_id
        assert expiry["expires_at"].endswith("Z")


@pytest.mark.slow
def test_the_environment_variable_asks_for_it_and_status_keeps_its_stdout(
    served_gateway: tuple[MockGateway, str],
) -> None:
    _, url = served_gateway
    task_id = json.loads(run("submit", "a cat", "--base-url", url, "--json").stdout)["task_id"]
    run("poll", task_id, "--base-url", url, "-q")
    for data in ([], ["--json"]):
        text = run("status", task_id, "--base-url", url, *data)
        logged = run("status", task_id, "--base-url", url, *data, IMGGW_LOG_FORMAT="json")
        assert (text.returncode, logged.returncode) == (0, 0)
        assert steady(logged.stdout) == steady(text.stdout)
        assert objects(logged.stderr) == []  # status says nothing on stderr: nothing to wrap
    # the option typed on the command line beats the environment, as for every global option
    wrong = ["status", task_id, "--base-url", url]
    as_text = run(*wrong, "--log-format", "text", IMGGW_LOG_FORMAT="json", IMGGW_API_KEY=WRONG)
    assert as_text.stderr.startswith("error: the API key was refused")


@pytest.mark.slow
def test_a_refused_key_is_one_error_object_with_the_exit_code(
    served_gateway: tuple[MockGateway, str],
) -> None:
    gw, url = served_gateway
    text = run("submit", "a cat", "--base-url", url, IMGGW_API_KEY=WRONG)
    logged = run("submit", "a cat", "--base-url", url, "--log-format", "json", IMGGW_API_KEY=WRONG)
    assert text.returncode == logged.returncode == 4
    assert logged.stdout == text.stdout == ""
    [error] = objects(logged.stderr)
    assert error["level"] == "error"
    assert error["event"] == "error"
    assert error["exit_code"] == 4
    assert error["error_type"] == "AuthenticationError"
    assert error["message"] == text.stderr.rstrip("\n")  # the text line, as it was
    assert "traceback" not in error
    assert gw.stats()["tasks_created"] == 0


@pytest.mark.slow
def test_verbose_puts_the_traceback_and_the_debug_logs_inside_objects(
    served_gateway: tuple[MockGateway, str],
) -> None:
    _, url = served_gateway
    done = run("status", "1", "--base-url", url, "-v", "--log-format", "json", IMGGW_API_KEY=WRONG)
    assert done.returncode == 4
    records = objects(done.stderr)  # no "Traceback" line of its own: each line parses
    logs = [r for r in records if r["event"] == "log"]
    assert any(r["level"] == "debug" and r["logger"] == "imggw_client" for r in logs), records
    error = records[-1]
    assert error["event"] == "error"
    assert error["traceback"].startswith("Traceback (most recent call last)")
    assert "AuthenticationError" in error["traceback"]
    assert not any(line.startswith(("Traceback", "  File")) for line in done.stderr.splitlines())


@pytest.mark.slow
def test_a_batch_logs_its_progress_with_counts_and_its_summary_as_one_object(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"prompt": "a cat"}\n{"prompt": "a dog"}\n{"prompt": "x", "resolution": "9k"}\n'
        '{"prompt": "a fox"}\n'
    )
    for data in ([], ["--json"]):
        out = tmp_path / f"out{len(data)}"
        batch = ["batch", str(source), "-o", str(out), "--base-url", url, "--skip-bad-lines", *data]
        logged = run("--log-format", "json", *batch)
        assert logged.returncode == 1, logged.stderr  # a bad line skipped: some lines failed
        again = run(*batch)  # the text form, resumed: nothing left to do, the same stdout
        assert again.returncode == 1
        assert logged.stdout == again.stdout
        records = objects(logged.stderr)
        progress = [r for r in records if r["event"] == "batch_progress"]
        assert progress, logged.stderr
        assert all(
            set(r["counts"]) == {"pending", "running", "downloading", "succeeded", "failed"}
            for r in progress
        )
        assert progress[-1]["counts"]["succeeded"] == 3
        assert progress[-1]["finished"] == progress[-1]["total"] == 3
        assert progress[-1]["spent"]["credits"] > 0
        [summary] = [r for r in records if r["event"] == "batch_summary"]
        assert summary["counts"]["succeeded"] == 3
        assert summary["bad_lines"] == 1
        assert summary["exit_code"] == 1
        [bad] = [r for r in records if r["event"] == "bad_line"]
        assert bad["line"] == 3
        assert "─" not in logged.stderr  # no rich table


def on_a_terminal(*args: str) -> tuple[int, str, str]:
    """The command with its stderr a pseudo-terminal: exit code, stdout, what reached it."""
    code, out, seen = terminal(args, env(), timeout=60)
    return code, out, seen.replace("\r\n", "\n")


@pytest.mark.slow
def test_on_a_terminal_too_there_is_no_live_display_only_objects(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    source = tmp_path / "in.txt"
    source.write_text("a cat\na dog\n")
    code, out, err = on_a_terminal(
        "batch", str(source), "-o", str(tmp_path / "out"), "--base-url", url, "--log-format", "json"
    )
    assert code == 0, err
    assert out == f"{tmp_path / 'out' / 'manifest.jsonl'}\n"
    events = [r["event"] for r in objects(err)]  # no bar, no table: escape codes would not parse
    assert events[-1] == "batch_summary"
    assert "batch_progress" in events
    code, out, err = on_a_terminal(
        "generate", "a cat", "-o", str(tmp_path), "--base-url", url, "--log-format", "json"
    )
    assert code == 0, err
    assert {r["event"] for r in objects(err)} == {"progress", "links_expire"}


@pytest.mark.slow
def test_usage_errors_are_objects_too(served_gateway: tuple[MockGateway, str]) -> None:
    gw, url = served_gateway
    for args in (
        ["--rate", "abc", "submit", "a cat", "--base-url", url, "--log-format", "json"],
        ["submit", "a cat", "--base-url", url, "--log-format=json", "--query-rate", "0"],
        ["--log-format", "json", "submit", "a cat", "--no-such-option"],
        ["--log-format", "json", "submit"],
        ["--log-format", "json", "no-such-command"],
    ):
        done = run(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stdout == ""
        [error] = objects(done.stderr)
        assert (error["level"], error["event"], error["exit_code"]) == ("error", "usage_error", 2)
    assert gw.stats()["requests"] == {}


@pytest.mark.slow
def test_a_bad_log_format_exits_2_with_one_line(served_gateway: tuple[MockGateway, str]) -> None:
    gw, url = served_gateway
    done = run("--log-format", "xml", "status", "1", "--base-url", url)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "error: --log-format must be text or json (got 'xml')\n"
    from_env = run("status", "1", "--base-url", url, IMGGW_LOG_FORMAT="xml")
    assert from_env.returncode == 2
    assert from_env.stderr == "error: IMGGW_LOG_FORMAT must be text or json (got 'xml')\n"
    # the environment asked for JSON: the bad option is reported that way
    both = run("status", "1", "--base-url", url, "--log-format", "xml", IMGGW_LOG_FORMAT="json")
    assert both.returncode == 2
    [error] = objects(both.stderr)
    assert error["message"] == "error: --log-format must be text or json (got 'xml')"
    assert gw.stats()["requests"] == {}


@pytest.mark.parametrize(("sent", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.slow
@pytest.mark.gateway(duration_min=30, duration_max=30)
def test_ctrl_c_or_sigterm_during_a_wait_is_an_interrupted_object_and_its_exit_code(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, sent: signal.Signals, code: int
) -> None:
    _, url = served_gateway
    child = subprocess.Popen(
        [
            *IMGGW,
            "--log-format",
            "json",
            "generate",
            "a cat",
            "--base-url",
            url,
            "-o",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert child.stderr is not None
    first = json.loads(child.stderr.readline())  # the wait is under way
    assert first["event"] == "progress"
    child.send_signal(sent)
    out, rest = child.communicate(timeout=30)
    assert child.returncode == code
    assert out == ""
    assert CANARY not in out + rest
    records = objects(rest)
    last = records[-1]
    assert (last["event"], last["level"], last["exit_code"]) == ("interrupted", "error", code)
    assert last["signal"] == sent.name
    assert last["task_id"] == first["task_id"]
    assert last["resume"].startswith(f"imggw download {first['task_id']} --wait")


def test_each_command_in_one_process_starts_from_the_environment_again(
    served_gateway: tuple[MockGateway, str],
) -> None:
    """In-process runs (tests, embedding): one command's --log-format json is not the next's."""
    _, url = served_gateway
    logged = imggw("--log-format", "json", "status", "1", "--base-url", url)
    assert logged.code == 1  # no such task
    assert json.loads(logged.err)["event"] == "error"
    text = imggw("status", "1", "--base-url", url)
    assert text.err.startswith("error: No such task")
    from_env = imggw("status", "1", "--base-url", url, env={"IMGGW_LOG_FORMAT": "json"})
    assert json.loads(from_env.err)["exit_code"] == 1


@pytest.mark.parametrize(
    ("argv", "chosen"),
    [
        ([], None),
        (["--log-format", "json"], "json"),
        (["--log-format=JSON", "status", "1"], "json"),
        (["--log-format", "json", "status", "--log-format", "text"], "text"),
        (["--log-format", "json", "--log-format", "xml"], "json"),  # the option reports xml
        (["--log-format"], None),
        (["submit", "--", "--log-format", "json"], None),  # after --: a prompt, not an option
    ],
)
def test_the_format_is_read_from_the_command_line_before_click_parses_it(
    argv: list[str], chosen: str | None
) -> None:
    assert _output.from_argv(argv) == chosen


def test_every_string_of_an_object_is_sanitized_and_the_key_blanked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("IMGGW_API_KEY", CANARY)
    record = _output.record(
        f"sent {CANARY}\x1b[2J",
        level="info",
        event="note",
        reason="a\x07b",
        nested={"k": [CANARY]},
        gone=None,
        where=Path("/tmp/x"),
        nan=float("nan"),
    )
    assert record["message"] == "sent [redacted]\\x1b[2J"
    assert record["reason"] == "a\\x07b"
    assert record["nested"] == {"k": ["[redacted]"]}
    assert "gone" not in record
    assert record["where"] == "/tmp/x"
    assert record["nan"] is None
    json.dumps(record, allow_nan=False)


def test_a_crash_is_one_object_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug escaping every command's handling: Python would print its traceback as lines."""
    from imggw_cli import _app

    def broken(**_: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(_app, "app", broken)
    try:
        _output.use(_output.JSON)  # as run() sets it from --log-format json
        assert _app._run_json() == 1
    finally:
        _output.use(_output.TEXT)
    [crash] = objects(capsys.readouterr().err)
    assert (crash["event"], crash["level"], crash["exit_code"]) == ("crash", "error", 1)
    assert crash["message"] == "RuntimeError: a bug"
    assert crash["traceback"].endswith("RuntimeError: a bug\n")


def test_python_warnings_are_objects_too(capsys: pytest.CaptureFixture[str]) -> None:
    import warnings

    from imggw_cli._globals import Globals
    from imggw_cli._runtime import setup_logging

    with warnings.catch_warnings():  # Python's showwarning is put back on the way out
        warnings.simplefilter("always")
        try:
            _output.use(_output.JSON)
            setup_logging(Globals())
            warnings.warn("a library's warning", UserWarning, stacklevel=1)
        finally:
            _output.use(_output.TEXT)
            setup_logging(Globals())
    [warned] = objects(capsys.readouterr().err)
    assert (warned["event"], warned["level"], warned["logger"]) == ("log", "warning", "py.warnings")
    assert warned["message"] == "UserWarning: a library's warning"
    assert warned["source"].startswith(__file__)
