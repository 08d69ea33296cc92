"""Collecting tasks made elsewhere (DESIGN 12), over a real loopback socket: `imggw --json
submit` piped into `imggw download --from - --wait`, manifests as input, mixed surfaces, bad
lines, unknown tasks, dead links refreshed, and downloads in the order their links die."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from imggw_cli._app import app
from imggw_client import Client, PollPolicy, RetryPolicy
from imggw_client.batch import collect_tasks, run_batch
from imggw_client.mock import MockGateway

from ..conftest import PNG
from ..loopback import serve_asgi

KEY = "sk-collect-key-0042"
FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05),
}


pytestmark = pytest.mark.gateway(api_keys=[KEY], duration_min=0.05, duration_max=0.2)


def imggw(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        app, list(args), env={"IMGGW_API_KEY": KEY, "IMGGW_BASE_URL": None}, input=stdin
    )
    assert KEY not in result.stdout + result.stderr
    return result.exit_code, result.stdout, result.stderr


def results_fetched(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if "/results/" in route)


class Clock:
    """Real time plus whatever a test adds: links can die while the test waits a moment."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def collect(source: str, out: str, url: str, stdin: str | None = None) -> tuple[int, str, str]:
    """``imggw download --from SOURCE --wait -o OUT``: the tasks collected from ``url``."""
    return imggw("download", "--from", source, "--wait", "-o", out, "--base-url", url, stdin=stdin)


def submit_json(url: str, prompts: list[str], *surface: str) -> str:
    lines = []
    for prompt in prompts:
        code, out, err = imggw("--json", "submit", prompt, "--base-url", url, *surface)
        assert code == 0, err
        lines.append(out.strip())
    return "\n".join(lines) + "\n"


def manifest(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_submit_json_piped_into_download_from_saves_every_file_and_creates_no_task(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    submitted = submit_json(gateway_url, ["a cat", "a dog", "a fox"])
    created = gateway.stats()["tasks_created"]
    out = tmp_path / "out"
    code, stdout, err = collect("-", str(out), gateway_url, stdin=submitted)
    assert code == 0, err
    assert stdout.strip() == str(out / "manifest.jsonl")
    assert gateway.stats()["tasks_created"] == created  # collected, never submitted
    records = manifest(out)
    assert [r["line"] for r in records] == [1, 2, 3]
    ids = [json.loads(line)["task_id"] for line in submitted.splitlines()]
    assert [r["task_id"] for r in records] == ids
    for record in records:
        (file,) = record["files"]
        assert (out / file["path"]).stat().st_size == file["size"]
        assert record["status"] == "succeeded"
    fetched = results_fetched(gateway)
    code, _, _ = collect("-", str(out), gateway_url, stdin=submitted)
    assert code == 0
    assert results_fetched(gateway) == fetched  # a rerun saves nothing twice
    assert manifest(out) == records


@pytest.mark.slow
def test_a_batch_manifest_is_collect_input_too_and_mixed_surfaces_work(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    mixed = submit_json(gateway_url, ["a cat"]) + submit_json(
        gateway_url, ["a dog"], "--surface", "alpha"
    )
    first = tmp_path / "first"
    code, _, err = collect("-", str(first), gateway_url, stdin=mixed)
    assert code == 0, err
    assert [r["surface"] for r in manifest(first)] == ["beta", "alpha"]
    again = tmp_path / "again"  # the manifest of one collect is the input of the next
    code, _, err = collect(str(first / "manifest.jsonl"), str(again), gateway_url)
    assert code == 0, err
    assert [r["files"][0]["sha256"] for r in manifest(again)] == [
        r["files"][0]["sha256"] for r in manifest(first)
    ]


@pytest.mark.slow
def test_tasks_of_both_surfaces_with_one_id_keep_both_files(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    alpha = json.loads(submit_json(gateway_url, ["a cat"], "--surface", "alpha"))
    gateway._next_id -= 1  # the reference gateway numbers across surfaces; real ones need not
    beta = json.loads(submit_json(gateway_url, ["a dog"]))
    assert alpha["task_id"] == beta["task_id"]
    out = tmp_path / "out"
    code, _, err = collect(
        "-", str(out), gateway_url, stdin=json.dumps(beta) + "\n" + json.dumps(alpha) + "\n"
    )
    assert code == 0, err
    records = manifest(out)
    names = [r["files"][0]["path"] for r in records]
    task_id = beta["task_id"]
    assert names == [f"{task_id}-0.png", f"alpha-{task_id}-0.png"]  # beta is the run's surface
    assert records[0]["files"][0]["sha256"] != records[1]["files"][0]["sha256"]
    for record in records:
        saved = (out / record["files"][0]["path"]).read_bytes()
        assert hashlib.sha256(saved).hexdigest() == record["files"][0]["sha256"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not-an-id", "not a task id"),
        ("0123", "not a task id"),
        ('{"task_id": "7", "surface": "gamma"}', "surface must be one of"),
        ('{"task_id": "7"', "not a JSON object"),
        ('{"task_id": 7.5}', "not a task id"),
        ('{"line": 3, "task_id": null}', "names no task"),
        ('{"task_id": "7", "task_id": "8"}', "repeated key 'task_id'"),
        ('{"task_id": "7", "colour": "red"}', "unknown field"),
    ],
)
def test_a_bad_line_stops_the_run_before_anything_is_sent(
    gateway: MockGateway, gateway_url: str, tmp_path: Path, line: str, reason: str
) -> None:
    source = tmp_path / "ids.txt"
    source.write_text(f"1\n{line}\n")
    code, _, err = imggw(
        "download", "--from", str(source), "-o", str(tmp_path / "out"), "--base-url", gateway_url
    )
    assert code == 2
    assert "line 2:" in err
    assert reason in err
    assert gateway.stats()["requests"] == {}


@pytest.mark.slow
def test_skip_bad_lines_reports_them_and_an_unknown_task_fails_only_its_line(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    ids = [json.loads(line)["task_id"] for line in submit_json(gateway_url, ["a cat"]).splitlines()]
    source = tmp_path / "ids.txt"
    source.write_text(f"{ids[0]}\n0123\n999999\n")
    out = tmp_path / "out"
    code, _, err = imggw(
        "download",
        "--from",
        str(source),
        "--wait",
        "--skip-bad-lines",
        "-o",
        str(out),
        "--base-url",
        gateway_url,
    )
    assert code == 1, err  # some lines failed; the run went on
    records = {r["line"]: r for r in manifest(out)}
    assert records[1]["status"] == "succeeded"
    assert records[2]["error"]["code"] == "invalid_line"
    assert records[3]["status"] == "failed"
    assert records[3]["error"]["code"] == "not_found"


@pytest.mark.slow
@pytest.mark.gateway(duration_min=30, duration_max=30)
def test_without_wait_unfinished_tasks_are_reported_and_the_rest_saved(
    gateway_url: str, tmp_path: Path
) -> None:
    with Client(api_key=KEY, base_url=gateway_url) as client:
        running = client.submit("slow").task_id
    source = tmp_path / "ids.txt"
    source.write_text(f"{running}\n")
    code, _, err = imggw(
        "download", "--from", str(source), "-o", str(tmp_path / "out"), "--base-url", gateway_url
    )
    assert code == 3, err
    (record,) = manifest(tmp_path / "out")
    assert record["status"] == "running"


@pytest.mark.slow
@pytest.mark.gateway(duration_min=0.02, duration_max=0.05, link_ttl=60, retention=86_400)
def test_a_batch_resumed_after_its_links_died_saves_every_file_through_fresh_links(
    make_gateway: Callable[..., MockGateway],
    serve_gateway: Callable[[MockGateway], str],
    tmp_path: Path,
) -> None:
    clock = Clock()  # the test moves it: made here, so the gateway is too
    gw = make_gateway(clock=clock)
    base_url = serve_gateway(gw)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(4)))

    def batch() -> Any:
        return run_batch(source, tmp_path / "out", client_factory=lambda: _client(base_url))

    first = batch()
    assert first.exit_code == 0
    saved = manifest(tmp_path / "out")
    for record in saved:  # the downloads "were cut short": the files are gone
        (tmp_path / "out" / record["files"][0]["path"]).unlink()
    clock.offset += 3600  # the links handed out then are dead now; the files are kept
    queries = gw.stats()["requests"].get("GET /beta/v1/tasks/{id}", 0)
    second = batch()
    assert second.exit_code == 0, second.counts
    assert second.counts == {"saved": 4}  # not "expired": the gateway still had every file
    assert [r["files"][0]["sha256"] for r in manifest(tmp_path / "out")] == [
        r["files"][0]["sha256"] for r in saved
    ]
    assert gw.stats()["requests"]["GET /beta/v1/tasks/{id}"] == queries + 4  # one each


def _client(base_url: str) -> Any:
    from imggw_client import AsyncClient

    return AsyncClient(api_key=KEY, base_url=base_url, **FAST)


def test_finished_tasks_are_downloaded_soonest_expiry_first(tmp_path: Path) -> None:
    """Ten finished tasks whose links die in an order unlike their ids, one download slot:
    after the first, every download takes the queued task whose links die soonest."""
    expiry = {str(i): 4_000_000_000 + ((i * 7) % 10) * 60 for i in range(1, 11)}
    fetched: list[str] = []
    answered: set[str] = set()

    async def gateway_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path.startswith("/results/"):
            fetched.append(path.rsplit("/", 1)[1].removesuffix(".png"))
            # The first download is held until every task was answered, so the queue holds
            # all of them when the slot frees, however fast the queries went out.
            for _ in range(1000):
                if len(answered) == len(expiry):
                    break
                await asyncio.sleep(0.005)
            body, kind = PNG, b"image/png"
        else:
            task_id = path.rsplit("/", 1)[1]
            answered.add(task_id)
            host = dict(scope["headers"])[b"host"].decode()
            image = {"url": [f"http://{host}/results/{task_id}.png"], "expires_at": expiry[task_id]}
            record = {"id": task_id, "status": "completed", "result": {"images": [image]}}
            body, kind = json.dumps({"code": 200, "data": record}).encode(), b"application/json"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    source = tmp_path / "ids.txt"
    source.write_text("".join(f"{i}\n" for i in expiry))
    with serve_asgi(gateway_app) as base_url:
        report = collect_tasks(
            source, tmp_path / "out", concurrency=1, client_factory=lambda: _client(base_url)
        )
    assert report.counts == {"saved": 10}
    assert len(fetched) == 10
    later = fetched[1:]  # the first may start before the others are queued
    assert later == sorted(later, key=lambda task_id: expiry[task_id])


def test_a_task_named_twice_with_and_without_its_surface_is_one_line(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    ids = [json.loads(line)["task_id"] for line in submit_json(gateway_url, ["a cat"]).splitlines()]
    source = tmp_path / "ids.jsonl"
    # "beta" is the default surface: both lines name one task, which is saved once.
    source.write_text(f'{ids[0]}\n{{"task_id": "{ids[0]}", "surface": "beta"}}\n')
    code, _, err = imggw(
        "download", "--from", str(source), "-o", str(tmp_path / "out"), "--base-url", gateway_url
    )
    assert code == 2, err
    assert "line 2: task repeats an earlier line" in err
    assert results_fetched(gateway) == 0


@pytest.mark.slow
def test_a_collect_list_that_grows_and_shrinks_is_collected_without_a_flag(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    """The nightly collector of docs/collecting.md: `download --from tasks.jsonl` on a list that
    grows by a line between runs (later loses one, then is run on another --surface). Collecting bills
    nothing: no flag is asked for, the new task is saved, the ones saved before are not fetched
    again, and nothing said mentions billing or a flag the command does not have."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(submit_json(gateway_url, ["a cat", "a dog"]))
    out = tmp_path / "out"
    said: list[str] = []

    def collect(*more: str) -> int:
        code, stdout, err = imggw(
            "download",
            "--from",
            str(tasks),
            "--wait",
            "-o",
            str(out),
            "--base-url",
            gateway_url,
            *more,
        )
        said.append(stdout + err)
        assert code == 0, err
        return code

    collect()
    fetched = results_fetched(gateway)
    assert fetched == 2
    with tasks.open("a") as more:
        more.write(submit_json(gateway_url, ["a fox"]))
    created = gateway.stats()["tasks_created"]
    collect()
    assert results_fetched(gateway) == fetched + 1  # only the new task's result
    assert gateway.stats()["tasks_created"] == created  # collected, never submitted
    records = manifest(out)
    assert [r["line"] for r in records] == [1, 2, 3]
    assert all(r["status"] == "succeeded" for r in records)
    assert all((out / r["files"][0]["path"]).is_file() for r in records)
    tasks.write_text("".join(tasks.read_text().splitlines(keepends=True)[1:]))  # one id less
    collect()
    assert [r["task_id"] for r in manifest(out)] == [r["task_id"] for r in records[1:]]
    collect("--surface", "alpha")  # the lines name their surface: the same tasks
    assert [r["task_id"] for r in manifest(out)] == [r["task_id"] for r in records[1:]]
    assert results_fetched(gateway) == fetched + 1
    assert gateway.stats()["tasks_created"] == created
    for text in said:
        assert "billed" not in text
        assert "allow-changes" not in text
        assert "changed" not in text


def test_collect_tasks_saves_a_list_of_ids_and_an_unknown_one_fails_only_its_line(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    """The SDK's driver of ``download --from``: ids in, files and a manifest out, nothing
    submitted; the same list again saves nothing twice."""
    ids = [
        json.loads(line)["task_id"]
        for line in submit_json(gateway_url, ["a cat", "a dog"]).splitlines()
    ]
    created = gateway.stats()["tasks_created"]
    make = lambda: _client(gateway_url)  # noqa: E731
    out = tmp_path / "out"
    report = collect_tasks([*ids, "999999"], out, client_factory=make, concurrency=2)
    assert report.counts == {"saved": 2, "failed": 1}
    assert report.exit_code == 1
    rows = manifest(out)
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert rows[2]["error"]["code"] == "not_found"
    assert gateway.stats()["tasks_created"] == created  # collected, never submitted
    fetched = results_fetched(gateway)
    again = collect_tasks([*ids, "999999"], out, client_factory=make)
    assert again.counts == report.counts
    assert results_fetched(gateway) == fetched  # a rerun saves nothing twice
