"""The imggw command, in-process through Typer's CliRunner: every command, --json, exit codes,
stdout and stderr kept apart, the key never printed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from imggw_client.mock import MockGateway

from ..loopback import http_json, raw_server
from .helpers import imggw

# The pinned fields of DESIGN 6, then money and link expiry.
TASK_FIELDS = {
    "task_id",
    "status",
    "progress",
    "image_urls",
    "error",
    "cost",
    "credits",
    "expires_at",
}


def test_version_and_help() -> None:
    assert imggw("--version").out.strip().startswith("imggw 0.")
    help_text = " ".join(imggw("--help").out.split())  # as wrapped for any terminal width
    for code in (
        "0 ok",
        "1 a task failed",
        "2 usage",
        "3 wait timed out",
        "4 authentication",
        "5 other API",
        "6 credits ran out",
        "130 interrupted",
        "143 SIGTERM",
        "129 SIGHUP",
    ):
        assert code in help_text
    generate_help = imggw("generate", "--help").out
    assert "auto|1:1|3:2" in generate_help
    assert "1k|2k|4k" in generate_help
    assert "alpha|beta" in generate_help


def test_generate_mock_saves_a_png_and_prints_its_path(tmp_path: Path) -> None:
    run = imggw("generate", "a lighthouse", "--mock", "-a", "16:9", "-o", str(tmp_path))
    assert run.code == 0, run.err
    (path,) = run.out.splitlines()
    saved = Path(path)
    assert saved.parent == tmp_path
    assert saved.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "succeeded" in run.err  # progress goes to stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_options_before_or_after_the_command(tmp_path: Path, where: str) -> None:
    flags = ["--mock", "--json", "--surface", "alpha", "-q"]
    args = ["generate", "a fox", "-o", str(tmp_path)]
    run = imggw(*(flags + args if where == "before" else args + flags))
    assert run.code == 0, run.err
    (record,) = run.records()
    assert set(record) == TASK_FIELDS | {"files"}
    assert record["status"] == "succeeded"
    assert record["error"] is None
    (file,) = record["files"]
    assert set(file) == {"path", "sha256", "size"}
    assert Path(file["path"]).stat().st_size == file["size"]
    assert run.err == ""  # --quiet


@pytest.mark.slow
def test_submit_status_poll_download_over_loopback(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    sub = imggw("submit", "a cat", "--base-url", url, "--json", "-r", "2K", "-a", "3:2")
    assert sub.code == 0, sub.err
    (record,) = sub.records()
    assert set(record) == {"task_id", "idempotency_key", "surface"}
    task_id = record["task_id"]
    again = imggw(
        "submit",
        "a cat",
        "--base-url",
        url,
        "--json",
        "-r",
        "2k",
        "-a",
        "3:2",
        "--idempotency-key",
        record["idempotency_key"],
    )
    assert again.records()[0]["task_id"] == task_id  # a safe retry: the same task
    assert gw.stats()["tasks_created"] == 1
    status = imggw("status", task_id, "--base-url", url, "--json")
    assert set(status.records()[0]) == TASK_FIELDS
    poll = imggw("--base-url", url, "poll", task_id, "--json")
    assert poll.code == 0
    assert poll.records()[0]["status"] == "succeeded"
    assert imggw("wait", task_id, "--base-url", url, "--json").records() == poll.records()
    got = imggw("download", task_id, "-o", str(tmp_path), "--base-url", url, "--json")
    assert got.code == 0, got.err
    (record,) = got.records()
    assert record["files"][0]["path"] == str(tmp_path / f"{task_id}-0.png")
    human = imggw("status", task_id, "--base-url", url)
    assert f"task_id: {task_id}" in human.out
    assert "status: succeeded" in human.out
    assert "image_url: http://127.0.0.1:" in human.out


def test_alpha_surface_over_loopback(served_gateway: tuple[MockGateway, str]) -> None:
    _, url = served_gateway
    sub = imggw("submit", "a cat", "--surface", "alpha", "--base-url", url, "--json")
    task_id = sub.records()[0]["task_id"]
    assert sub.records()[0]["surface"] == "alpha"
    assert imggw("poll", task_id, "--surface", "alpha", "--base-url", url, "-q").code == 0
    # The journal knows the task's surface; another one chosen, or no journal, asks beta.
    assert imggw("status", task_id, "--base-url", url).code == 0
    assert imggw("status", task_id, "--surface", "beta", "--base-url", url).code == 1
    assert imggw("status", task_id, "--no-journal", "--base-url", url).code == 1


def test_exit_1_for_a_failed_task(tmp_path: Path) -> None:
    run = imggw(
        "generate", "a fox #fail:content_policy_violation", "--mock", "--json", "-o", str(tmp_path)
    )
    assert run.code == 1
    assert "content policy" in run.err
    # A script gets the failed task's record to read beside the exit code.
    (record,) = run.records()
    assert record["status"] == "failed"
    assert record["error"]["code"] == "content_policy_violation"
    assert record["image_urls"] == []


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "a cat", "--mock", "-a", "auto", "-r", "4k"],  # a combination rule
        ["submit", "   ", "--mock"],  # a blank prompt
        ["submit", "a cat", "--mock", "-a", "7:5"],  # not a choice: Typer's usage error
        ["submit", "a cat", "--mock", "--idempotency-key", "bad key\n"],
        ["status", "012", "--mock"],
        ["nonsense"],
    ],
)
def test_exit_2_for_usage_and_invalid_requests(args: list[str]) -> None:
    run = imggw(*args)
    assert run.code == 2, (run.out, run.err)
    assert run.out == ""
    assert run.err


@pytest.mark.parametrize("command", ["submit", "generate"])
def test_an_empty_idempotency_key_is_refused_not_replaced_by_a_new_one(
    served_gateway: tuple[MockGateway, str], command: str, tmp_path: Path
) -> None:
    # `--idempotency-key "$KEY"` with KEY unset: a fresh key on every retry would pay again.
    gateway, url = served_gateway
    saving = ["-o", str(tmp_path)] if command == "generate" else []
    run = imggw(command, "a cat", "--base-url", url, "--idempotency-key", "", *saving)
    assert run.code == 2, (run.out, run.err)
    assert run.out == ""
    assert (
        run.err
        == "error: --idempotency-key: must be a non-empty string (invalid_idempotency_key)\n"
    )
    assert gateway.stats()["requests"] == {}  # nothing sent
    assert list(tmp_path.iterdir()) == []


def test_exit_2_for_a_reused_key(served_gateway: tuple[MockGateway, str]) -> None:
    """The journal knows the key's request: another one is refused before it is sent
    (DESIGN 22), in the command line's words."""
    gw, url = served_gateway
    imggw("submit", "a cat", "--base-url", url, "--idempotency-key", "order-1")
    run = imggw("submit", "a dog", "--base-url", url, "--idempotency-key", "order-1")
    assert run.code == 2
    assert "for another request" in run.err
    assert "nothing was sent" in run.err
    assert "(leave --idempotency-key out)" in run.err
    assert gw.stats()["tasks_created"] == 1
    elsewhere = imggw(
        "submit", "a dog", "--base-url", url, "--idempotency-key", "order-1", "--no-journal"
    )
    assert elsewhere.code == 2  # the gateway refuses it too: a reused key
    assert "idempotency_key_reused" in elsewhere.err


@pytest.mark.slow
@pytest.mark.gateway(duration_min=30, duration_max=30)
def test_exit_3_on_timeout_with_how_to_resume(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    sub = imggw("submit", "a cat", "--base-url", url, "--json").records()[0]
    run = imggw("poll", sub["task_id"], "--timeout", "0.3", "--base-url", url)
    gen = imggw("generate", "a cat", "--timeout", "0.3", "--base-url", url, "-o", str(tmp_path))
    dl = imggw("download", sub["task_id"], "--base-url", url, "-o", str(tmp_path))
    # --wait -t 0 means now, not the default 600 s: one look, then exit 3
    now = imggw(
        "download", sub["task_id"], "--wait", "-t", "0", "--base-url", url, "-o", str(tmp_path)
    )
    assert run.code == 3
    assert f"resume with: imggw poll {sub['task_id']} --surface beta" in run.err
    assert gen.code == 3
    # poll only waits: what resumes generate also saves its result, and pays for nothing new
    assert f"resume with: imggw download {int(sub['task_id']) + 1} --wait --surface beta -o " in (
        gen.err
    )
    assert dl.code == 3
    assert now.code == 3
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"IMGGW_API_KEY": None}, "IMGGW_API_KEY"),
        ({"IMGGW_API_KEY": "wrong-key"}, "refused"),
        ({"IMGGW_BASE_URL": "gateway.example"}, "http"),
    ],
)
def test_exit_4_for_authentication_and_configuration(
    served_gateway: tuple[MockGateway, str], env: dict[str, str | None], says: str
) -> None:
    _, url = served_gateway
    run = imggw("status", "1", env={"IMGGW_BASE_URL": url, **env})
    assert run.code == 4
    assert says in run.err
    assert len(run.err.strip().splitlines()) == 1  # one line, no traceback


def test_download_without_a_key_exits_4_in_one_line() -> None:
    run = imggw("download", "1", "--base-url", "http://127.0.0.1:9", env={"IMGGW_API_KEY": None})
    assert run.code == 4
    assert run.err.startswith("error: no API key")
    assert "IMGGW_API_KEY" in run.err
    assert len(run.err.splitlines()) == 1  # no traceback


def test_exit_4_without_a_base_url() -> None:
    run = imggw("status", "1")
    assert run.code == 4
    assert "IMGGW_BASE_URL" in run.err


def test_exit_5_for_a_network_error_and_1_for_no_such_task(no_backoff: list[float]) -> None:
    run = imggw("status", "1", "--base-url", "http://127.0.0.1:9")
    assert run.code == 5
    assert "http://127.0.0.1:9" in run.err
    missing = imggw("status", "1", "--mock")
    assert missing.code == 1  # no such task (DESIGN 18: a task the key cannot see is 1)
    assert "imggw mock serve" in missing.err


@pytest.mark.gateway(fault_rate=1.0, faults=["lost"])
def test_exit_5_for_an_unknown_submit_outcome_with_the_safe_retry(
    served_gateway: tuple[MockGateway, str],
    no_backoff: list[float],
) -> None:
    lossy, url = served_gateway
    run = imggw("submit", "a private prompt", "--base-url", url, "-a", "16:9")
    assert run.code == 5
    assert "--idempotency-key" in run.err
    assert "--aspect-ratio 16:9" in run.err
    assert "private" not in run.err
    stats = lossy.stats()
    assert (stats["tasks_created"], stats["replays"]) == (1, 5)  # six attempts, one key, one task


def test_verbose_logs_go_to_stderr_without_the_key(served_gateway: tuple[MockGateway, str]) -> None:
    _, url = served_gateway
    run = imggw("submit", "a cat", "--base-url", url, "--verbose", "--json")
    assert run.code == 0
    assert "POST /beta/v1/images/generations -> 200" in run.err
    json.loads(run.out)  # stdout stays pure JSON
    bad = imggw("status", "1", "--base-url", url, "-v", env={"IMGGW_API_KEY": "wrong-key-abcdef"})
    assert "Traceback (most recent call last)" in bad.err  # --verbose shows the traceback
    assert "AuthenticationError" in bad.err
    assert "Logging error" not in bad.err
    assert "wrong-key-abcdef" not in bad.err


@pytest.mark.parametrize("path", ["/beta/v1/tasks/1", "/beta/v1/tasks/2"])
def test_verbose_tracebacks_blank_a_key_the_gateway_echoes(
    path: str, no_backoff: list[float]
) -> None:
    """A short key (7 characters) echoed in an error's message, or in a redirect's target: the
    traceback -v prints beside the error line blanks it, as that line does."""
    key = "Zq7!x9k"
    refused = {"code": 401, "error": {"code": "unauthorized", "message": f"bad key {key}"}}
    answers = {
        "/beta/v1/tasks/1": http_json(401, json.dumps(refused).encode()),
        "/beta/v1/tasks/2": (
            f"HTTP/1.1 302 X\r\nLocation: https://login.example/{key}/renew\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n"
        ).encode(),
    }

    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        conn.sendall(answers[path])

    with raw_server(answer) as url:
        run = imggw(
            "status",
            path.rsplit("/", 1)[1],
            "--base-url",
            url,
            "-v",
            env={"IMGGW_API_KEY": key},
        )
    assert run.code != 0
    assert "Traceback (most recent call last)" in run.err
    assert "[redacted]" in run.err
    assert key not in run.err + run.out


@pytest.mark.slow
def test_download_reports_each_task_and_the_worst_exit(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    ok = imggw("submit", "a cat", "--base-url", url, "--json").records()[0]["task_id"]
    bad = imggw("submit", "a cat #fail", "--base-url", url, "--json").records()[0]["task_id"]
    imggw("poll", ok, "--base-url", url, "-q")
    imggw("poll", bad, "--base-url", url, "-q")
    run = imggw("download", ok, bad, "--base-url", url, "-o", str(tmp_path), "--json")
    assert run.code == 1
    records = run.records()
    assert [r["status"] for r in records] == ["succeeded", "failed"]
    assert records[1]["files"] == []
    Path(records[0]["files"][0]["path"]).write_bytes(b"mine")  # another file of that name
    again = imggw("download", ok, "--base-url", url, "-o", str(tmp_path))
    assert again.code == 2  # a usage matter: the file is there
    assert "--overwrite" in again.err
    assert imggw("download", ok, "--base-url", url, "-o", str(tmp_path), "--overwrite").code == 0


def test_a_failed_download_gives_no_hint_to_run_the_download_again(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    """The "save its results with: imggw download" hint is for generate: after a failed
    imggw download it would name the command that just failed."""
    _, url = served_gateway
    task_id = imggw("submit", "a cat", "--base-url", url, "--json").records()[0]["task_id"]
    assert imggw("poll", task_id, "--base-url", url, "-q").code == 0
    first = imggw("download", task_id, "--base-url", url, "-o", str(tmp_path))
    assert first.code == 0
    Path(first.out.strip()).write_bytes(b"mine")  # another file of that name: a conflict
    again = imggw("download", task_id, "--base-url", url, "-o", str(tmp_path))
    assert again.code == 2
    assert again.err.count("\n") == 1, again.err
    assert "exists; pass --overwrite to replace it (file_exists)" in again.err
    assert "save its results" not in again.err


def test_generate_checks_its_folder_before_paying_and_says_how_to_save_a_paid_result(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("mine")
    refused = imggw("generate", "a cat", "--base-url", url, "-o", str(a_file))
    assert refused.code == 2
    assert "a file is there, not a folder; nothing was sent" in refused.err
    assert gw.stats()["requests"] == {}
    task_id = str(gw.config.first_task_id)
    (tmp_path / f"{task_id}-0.png").write_bytes(b"mine")  # the name its result will take
    clash = imggw("generate", "a cat", "--base-url", url, "-o", str(tmp_path))
    assert clash.code == 2, clash.err
    assert "exists; pass --overwrite to replace it (file_exists)" in clash.err
    hint = (
        f"the task succeeded and is paid for; save its results with: imggw download {task_id} "
        f"--surface beta -o DIR --base-url {url} (DIR: another folder, or add --overwrite)"
    )
    assert hint in clash.err
    assert (tmp_path / f"{task_id}-0.png").read_bytes() == b"mine"
    saved = imggw("download", task_id, "--base-url", url, "-o", str(tmp_path / "elsewhere"))
    assert saved.code == 0, saved.err
    assert gw.stats()["tasks_created"] == 1
