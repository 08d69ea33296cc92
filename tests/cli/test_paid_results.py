"""What a user paid for is never lost and never invites paying twice: short keys that occur in
result links, a disk that fills up, a full folder before the submit, and the record a script
reads when a task fails or is still running. Over loopback against the reference gateway."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from imggw_client.mock import MockGateway, MockRequest, MockResponse

from .helpers import CANARY, imggw, imggw_batch

RUN_LIMITED = (
    "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "limit = int(sys.argv.pop(1)); resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); "
    "from imggw_cli import main; sys.argv[0] = 'imggw'; main()"
)


def limited(limit: int, *args: str, key: str = CANARY) -> subprocess.CompletedProcess[str]:
    """The CLI in a process whose writes past ``limit`` bytes fail (EFBIG, as a full disk's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")}
    return subprocess.run(
        [sys.executable, "-c", RUN_LIMITED, str(limit), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "IMGGW_API_KEY": key},
        check=False,
    )


# ---------------------------------------------------------------------------- short keys


@pytest.mark.parametrize("key", ["e", "1", "png", "http", "ab"])
@pytest.mark.slow
def test_a_short_key_that_occurs_in_result_links_loses_no_result(
    key: str,
    tmp_path: Path,
    make_gateway: Callable[..., MockGateway],
    serve_gateway: Callable[[MockGateway], str],
) -> None:
    gateway = make_gateway(api_keys=[key])
    env = {"IMGGW_API_KEY": key}
    url = serve_gateway(gateway)
    made = imggw("generate", "a fox", "--base-url", url, "--json", "-o", str(tmp_path), env=env)
    assert made.code == 0, made.err
    (record,) = made.records()
    assert len(record["files"]) == 1
    assert Path(record["files"][0]["path"]).read_bytes().startswith(b"\x89PNG")
    assert "not usable" not in made.err
    status = imggw("status", record["task_id"], "--base-url", url, "--json", env=env)
    assert status.code == 0
    assert len(status.records()[0]["image_urls"]) == 1
    source = tmp_path / "in.txt"
    source.write_text("a fox\na hen\n")
    batch = imggw("batch", str(source), "-o", str(tmp_path / "b"), "--base-url", url, env=env)
    assert batch.code == 0, batch.err
    assert len(list((tmp_path / "b").glob("*.png"))) == 2
    assert gateway.stats()["tasks_created"] == 3


@pytest.fixture
def key_in_links() -> Iterator[tuple[MockGateway, str]]:
    """A gateway whose result links carry the API key itself as a query value."""
    gateway = MockGateway(api_keys=[CANARY], duration_min=0.02, duration_max=0.05)
    handle = gateway.handle

    def with_key(request: MockRequest) -> MockResponse:
        answer = handle(request)
        if request.method == "GET" and b"/results/" in answer.body:
            body = answer.body.replace(b"&Signature=", f"&key={CANARY}&Signature=".encode())
            return MockResponse(answer.status, body, answer.headers)
        return answer

    gateway.handle = with_key  # type: ignore[method-assign]
    with gateway.serve() as url:
        yield gateway, url


def test_a_link_that_carries_the_key_is_kept_said_plainly_and_never_shown(
    key_in_links: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gateway, url = key_in_links
    made = imggw("generate", "a fox", "--base-url", url, "--json", "-o", str(tmp_path))
    assert made.code == 0, made.err  # helpers.Run also checks the key was never printed
    (record,) = made.records()
    assert Path(record["files"][0]["path"]).read_bytes().startswith(b"\x89PNG")
    status = imggw("status", record["task_id"], "--base-url", url)
    assert status.code == 0
    (line,) = [x for x in status.out.splitlines() if x.startswith("image_url:")]
    assert "key=[redacted]&Signature=" in line
    assert gateway.stats()["tasks_created"] == 1


# ---------------------------------------------------------------------------- full disks


@pytest.mark.gateway(result_size=20_000)
@pytest.mark.slow
def test_a_sync_download_onto_a_full_disk_is_one_line_and_leaves_no_part_file(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gateway, url = served_gateway
    out = tmp_path / "g"
    done = limited(16_384, "generate", "a fox", "--base-url", url, "-o", str(out))
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "(write_failed)" in errors[0]
    assert f"save its results with: imggw download 1 --surface beta -o {out}" in done.stderr
    assert list(out.iterdir()) == []  # no .part file left behind
    assert gateway.stats()["tasks_created"] == 1


@pytest.mark.gateway(result_size=20_000)
@pytest.mark.slow
def test_client_download_onto_a_full_disk_raises_download_error(
    gateway_url: str, tmp_path: Path
) -> None:
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))\n"
        "from imggw_client import Client, DownloadError\n"
        "with Client(api_key=sys.argv[1], base_url=sys.argv[2]) as c:\n"
        "    task = c.generate('a fox')\n"
        "    try:\n"
        "        c.download(task, sys.argv[3])\n"
        "    except DownloadError as err:\n"
        "        print(type(err).__name__, err.code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, CANARY, gateway_url, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "DownloadError write_failed"
    assert list(tmp_path.iterdir()) == []


def test_generate_refuses_a_folder_without_room_for_a_result_before_paying(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, url = served_gateway
    real = shutil.disk_usage

    def nearly_full(path: Any) -> Any:
        usage = real(path)
        return type(usage)(usage.total, usage.total, 0)

    monkeypatch.setattr(shutil, "disk_usage", nearly_full)
    run = imggw("generate", "a fox", "--base-url", url, "-o", str(tmp_path))
    assert run.code == 4
    assert "0.0 MiB free; a result may need about 4 MiB" in run.err
    assert "nothing was sent" in run.err
    assert gw.stats()["requests"] == {}


# ---------------------------------------------------------------------------- --json records


@pytest.mark.slow
def test_json_poll_and_generate_print_the_record_of_a_failed_or_unfinished_task(
    tmp_path: Path,
    make_gateway: Callable[..., MockGateway],
    serve_gateway: Callable[[MockGateway], str],
) -> None:
    slow = make_gateway(duration_min=30, duration_max=30)
    url = serve_gateway(slow)
    sub = imggw("submit", "a cat", "--base-url", url, "--json").records()[0]
    polled = imggw("poll", sub["task_id"], "-t", "0.3", "--base-url", url, "--json")
    made = imggw("generate", "a cat", "-t", "0.3", "--base-url", url, "--json", "-o", str(tmp_path))
    assert polled.code == 3
    assert [(r["task_id"], r["status"]) for r in polled.records()] == [(sub["task_id"], "pending")]
    assert made.code == 3
    (record,) = made.records()
    assert record["status"] in ("pending", "running")
    assert record["error"] is None
    failing = make_gateway()
    url = serve_gateway(failing)
    sub = imggw("submit", "a cat #fail", "--base-url", url, "--json").records()[0]
    polled = imggw("poll", sub["task_id"], "--base-url", url, "--json")
    assert polled.code == 1
    (record,) = polled.records()
    assert record["status"] == "failed"
    assert record["error"]["code"] == "generation_failed"


# ---------------------------------------------------------------------------- exit codes


def test_download_of_several_ids_exits_1_when_some_could_not_be_had(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    sub = imggw("submit", "a cat", "--base-url", url, "--json").records()[0]
    run = imggw(
        "download",
        sub["task_id"],
        "99999",
        "--wait",
        "--base-url",
        url,
        "--json",
        "-o",
        str(tmp_path),
    )
    assert run.code == 1, run.err
    assert [r["task_id"] for r in run.records()] == [sub["task_id"]]
    assert len(list(tmp_path.glob("*.png"))) == 1
    alone = imggw("download", "99999", "--base-url", url, "-o", str(tmp_path))
    assert alone.code == 1  # not found: the key cannot see it, alone or not


# ---------------------------------------------------------------------------- messages


def test_a_base_url_with_a_wrong_path_says_so_and_bills_nothing(
    served_gateway: tuple[MockGateway, str],
) -> None:
    gw, url = served_gateway
    wrong = url + "/api"
    run = imggw("submit", "a cat", "--base-url", wrong)
    assert run.code == 4
    assert f"no submit route at {wrong}/beta/v1/images/generations (HTTP 404" in run.err
    assert "the part before /alpha or /beta" in run.err
    status = imggw("status", "1", "--base-url", wrong)
    assert status.code == 1  # a 404 on a query: no such task there
    assert f"at {wrong} on surface beta: check the task id, --surface and --base-url" in status.err
    assert gw.stats()["tasks_created"] == 0


def test_a_proxy_that_cannot_be_reached_is_named(
    served_gateway: tuple[MockGateway, str], no_backoff: list[float]
) -> None:
    _, url = served_gateway
    proxy = {
        "HTTP_PROXY": "http://user:secret-pass@127.0.0.1:9",
        "NO_PROXY": None,
        "no_proxy": None,
        "http_proxy": None,
        "ALL_PROXY": None,
        "all_proxy": None,
    }
    run = imggw("status", "1", "--base-url", url, env=proxy)
    assert run.code == 5
    assert "through the proxy http://127.0.0.1:9 (from HTTP_PROXY)" in run.err
    assert "secret-pass" not in run.err
    bypassed = imggw("status", "1", "--base-url", url, env={**proxy, "NO_PROXY": "127.0.0.1"})
    assert bypassed.code == 1  # no such task: the proxy was not used
    assert "proxy" not in bypassed.err


def test_the_command_line_says_how_the_command_line_takes_its_key() -> None:
    run = imggw("status", "1", "--base-url", "http://127.0.0.1:9", env={"IMGGW_API_KEY": None})
    assert run.code == 4
    assert "set IMGGW_API_KEY" in run.err
    assert "api_key=" not in run.err
    none = imggw("status", "1", env={"IMGGW_BASE_URL": None})
    assert none.code == 4
    assert "pass --base-url or set IMGGW_BASE_URL" in none.err
    assert "base_url=" not in none.err


def test_a_batch_folder_that_cannot_be_made_exits_4_like_one_that_cannot_be_written(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, url = served_gateway
    source = tmp_path / "in.txt"
    source.write_text("a fox\n")
    target = tmp_path / "ro" / "new"
    real = Path.mkdir

    def read_only(self: Path, *args: Any, **kwargs: Any) -> None:
        if self == target:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    run = imggw_batch(source, target, url)
    assert run.code == 4, run.err
    assert f"cannot create {target} (Read-only file system)" in run.err
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    clash = imggw_batch(source, a_file, url)
    assert clash.code == 2
    assert "a file is there" in clash.err
    assert gw.stats()["requests"] == {}
