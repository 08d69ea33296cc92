"""The batch runner against the in-process reference gateway: resume, verification, changed
lines, bad input, locks, deadlines, expiry, rate limits."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imggw_client import AsyncClient, ImageRequest, PollPolicy, RetryPolicy
from imggw_client.batch import (
    BatchInputError,
    BatchLockedError,
    BatchReport,
    InputChangedError,
    read_lines,
    run_batch,
)
from imggw_client.batch._ledger import Ledger
from imggw_client.mock import MockGateway
from imggw_client.mock._gateway import MockResponse

from . import MANIFEST_FIELDS

FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05),
}


pytestmark = pytest.mark.gateway(duration_min=0.02, duration_max=0.1, retry_after=0, latency=0.02)


def batch(gw: MockGateway, source: Any, out: Path, **kw: Any) -> BatchReport:
    return run_batch(source, out, client_factory=lambda: gw.async_client(**FAST), **kw)


def jsonl(path: Path, records: list[dict[str, Any]], extra: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + extra)
    return path


def manifest(report: BatchReport) -> list[dict[str, Any]]:
    return [json.loads(line) for line in report.manifest.read_text().splitlines()]


def posts(gw: MockGateway) -> int:
    requests = gw.stats()["requests"]
    return sum(n for route, n in requests.items() if route.startswith("POST"))


def test_a_batch_runs_every_line_once_and_a_rerun_does_nothing(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    source = jsonl(
        tmp_path / "in.jsonl",
        [{"prompt": f"p{i}", "aspect_ratio": "16:9"} for i in range(20)],
        extra="\n# a comment\n   \n",
    )
    report = batch(gw, source, tmp_path / "out", concurrency=4)
    assert report.exit_code == 0
    assert report.counts == {"saved": 20}
    assert gw.stats()["tasks_created"] == 20
    assert report.credits == 80.0
    records = manifest(report)
    assert [r["line"] for r in records] == list(range(1, 21))
    for record in records:
        assert set(record) == MANIFEST_FIELDS
        assert record["status"] == "succeeded"
        assert record["prompt"] == f"p{record['line'] - 1}"
        assert (record["aspect_ratio"], record["resolution"]) == ("16:9", "1k")
        assert (record["credits"], record["cost"]) == (4.0, 0.01)
        assert record["expires_at"].endswith("Z")
        (file,) = record["files"]
        content = (tmp_path / "out" / file["path"]).read_bytes()
        assert hashlib.sha256(content).hexdigest() == file["sha256"]
        assert len(content) == file["size"]
    sent = posts(gw)
    again = batch(gw, source, tmp_path / "out")
    assert again.exit_code == 0
    assert posts(gw) == sent  # nothing submitted again
    assert manifest(again) == records


def test_text_input_and_iterables(make_gateway: Callable[..., MockGateway], tmp_path: Path) -> None:
    gw = make_gateway()
    text = tmp_path / "prompts.txt"
    text.write_text("a cat\n\n# skipped\na dog\n")
    report = batch(gw, text, tmp_path / "out1")
    assert [r["line"] for r in manifest(report)] == [1, 4]  # numbers from the file
    mixed = [ImageRequest("a fox", "3:2", "2k"), {"prompt": "an owl", "id": 7}, "a bee"]
    report = batch(gw, mixed, tmp_path / "out2")
    assert report.counts == {"saved": 3}
    assert [r["id"] for r in manifest(report)] == [None, "7", None]


def test_bad_lines_stop_before_anything_is_sent(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"prompt": "ok"}\n'
        "not json\n"
        '{"prompt": "x", "aspect_ratio": "auto", "resolution": "4k"}\n'
        '{"prompt": "y", "colour": "red"}\n'
        '{"aspect_ratio": "1:1"}\n'
        '{"prompt": "a", "id": "dup"}\n'
        '{"prompt": "b", "id": "dup"}\n'
    )
    with pytest.raises(BatchInputError) as info:
        batch(gw, source, tmp_path / "out")
    assert [(b.line, b.reason.split(" ")[0]) for b in info.value.bad_lines] == [
        (2, "not"),
        (3, "resolution:"),
        (4, "unknown"),
        (5, "prompt"),
        (7, "id"),
    ]
    assert "line 2" in str(info.value)
    assert gw.stats()["requests"] == {}  # nothing was sent
    report = batch(gw, source, tmp_path / "out", skip_bad_lines=True)
    assert report.counts == {"saved": 2}
    assert report.exit_code == 1
    records = {r["line"]: r for r in manifest(report)}
    assert records[3]["error"]["code"] == "invalid_line"
    assert records[6]["status"] == "succeeded"


@pytest.mark.slow
def test_a_killed_run_resumes_with_the_same_keys(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    # Every answer is lost: the gateway creates the tasks, the runner never learns their ids.
    gw = make_gateway(fault_rate=1.0, faults=["lost"])
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(10)])
    first = batch(gw, source, tmp_path / "out", timeout=0.5)
    assert first.exit_code == 3
    assert first.counts == {"pending": 10}
    assert gw.stats()["tasks_created"] == 10  # created, unknown to the runner
    gw.configure(fault_rate=0.0)
    second = batch(gw, source, tmp_path / "out")
    assert second.exit_code == 0
    stats = gw.stats()
    assert stats["tasks_created"] == 10  # the same keys: replays, no second task
    assert stats["replays"] >= 10


def test_missing_and_corrupt_files_are_downloaded_again(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(3)])
    records = manifest(batch(gw, source, tmp_path / "out"))
    corrupt = tmp_path / "out" / records[0]["files"][0]["path"]
    corrupt.write_bytes(b"garbage")
    missing = tmp_path / "out" / records[1]["files"][0]["path"]
    missing.unlink()
    report = batch(gw, source, tmp_path / "out")
    assert report.exit_code == 0
    assert gw.stats()["tasks_created"] == 3
    assert hashlib.sha256(corrupt.read_bytes()).hexdigest() == records[0]["files"][0]["sha256"]
    assert hashlib.sha256(missing.read_bytes()).hexdigest() == records[1]["files"][0]["sha256"]
    assert manifest(report) == records


def test_a_changed_input_is_refused_unless_allowed_then_changed_lines_are_new_requests(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway()
    source = tmp_path / "in.jsonl"
    jsonl(source, [{"prompt": "a cat", "id": "a"}, {"prompt": "a dog", "id": "b"}])
    before = {r["id"]: r for r in manifest(batch(gw, source, tmp_path / "out"))}
    # "b" changes its prompt; a new line is inserted before it (ids keep rows matched).
    jsonl(
        source,
        [
            {"prompt": "a cat", "id": "a"},
            {"prompt": "new", "id": "c"},
            {"prompt": "a wolf", "id": "b"},
        ],
    )
    sent = gw.stats()["requests"]
    with pytest.raises(InputChangedError) as info:  # nothing is paid for without consent
        batch(gw, source, tmp_path / "out")
    assert info.value.lines == [2, 3]  # 2 added, 3 edited
    assert "--allow-changes" in info.value.message
    assert gw.stats()["requests"] == sent
    report = batch(gw, source, tmp_path / "out", allow_changes=True)
    after = {r["id"]: r for r in manifest(report)}
    assert report.changed_lines == [2, 3]
    assert after["a"]["task_id"] == before["a"]["task_id"]
    assert after["b"]["task_id"] != before["b"]["task_id"]
    assert after["b"]["line"] == 3
    assert gw.stats()["tasks_created"] == 4
    with Ledger.open(tmp_path / "out") as ledger:
        keys = {row.identity: row.idempotency_key for row in ledger.iter_rows()}
    assert len(set(keys.values())) == 3
    assert batch(gw, source, tmp_path / "out").exit_code == 0  # the new input is the run's now


def test_a_second_process_on_the_same_folder_is_refused(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": "x"}])
    with Ledger.open(tmp_path / "out"), pytest.raises(BatchLockedError, match="another batch"):
        batch(gw, source, tmp_path / "out")
    assert gw.stats()["requests"] == {}
    assert batch(gw, source, tmp_path / "out").exit_code == 0  # free again


@pytest.mark.slow
def test_timeout_leaves_running_tasks_for_the_next_run(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway(duration_min=1.0, duration_max=1.0)
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(4)])
    first = batch(gw, source, tmp_path / "out", timeout=0.3)
    assert first.exit_code == 3
    assert first.counts == {"running": 4}
    assert {r["status"] for r in manifest(first)} == {"running"}
    second = batch(gw, source, tmp_path / "out")
    assert second.exit_code == 0
    assert gw.stats()["tasks_created"] == 4


def test_failed_and_expired_lines_are_reported(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway(retention=0.0)
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": "ok"}, {"prompt": "bad #fail:nsfw"}])
    report = batch(gw, source, tmp_path / "out")
    assert report.exit_code == 1
    records = manifest(report)
    assert records[0]["error"]["code"] == "result_expired"
    assert records[0]["files"] == []
    assert records[1]["status"] == "failed"
    assert records[1]["error"]["code"] == "nsfw"
    again = batch(gw, source, tmp_path / "out")
    assert gw.stats()["tasks_created"] == 2  # finished lines stay finished
    assert again.exit_code == 1


@pytest.mark.slow
def test_rate_limits_slow_the_run_but_fail_no_line(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway(fault_rate=0.6, faults=["429"], retry_after=0)
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(15)])
    report = batch(gw, source, tmp_path / "out", concurrency=8)
    assert report.exit_code == 0
    assert gw.stats()["faults"]["429"] > 10
    assert gw.stats()["tasks_created"] == 15


def test_read_lines_reports_unreadable_files(tmp_path: Path) -> None:
    from imggw_client import RequestValidationError

    with pytest.raises(RequestValidationError):
        read_lines(tmp_path / "missing.jsonl")


def test_bad_concurrency_and_unusable_folders_are_clear_errors(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    from imggw_client import RequestValidationError

    gw = make_gateway()
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": "x"}])
    for concurrency in (0, -2, True):
        with pytest.raises(RequestValidationError, match="concurrency"):
            batch(gw, source, tmp_path / "out", concurrency=concurrency)
    for timeout in (float("nan"), float("inf"), -1.0, "60", True):
        with pytest.raises(RequestValidationError, match="timeout: must be a finite number"):
            batch(gw, source, tmp_path / "out", timeout=timeout)
    assert not (tmp_path / "out").exists()  # refused before anything was opened
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    with pytest.raises(RequestValidationError, match="output folder"):
        batch(gw, source, a_file / "out")
    assert gw.stats()["requests"] == {}


def test_an_unexpected_fault_on_one_line_leaves_it_for_the_next_run_and_the_rest_go_on(
    make_gateway: Callable[..., MockGateway], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = "sk-unexpected-fault-0001"
    gw = make_gateway(api_keys=[key])
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(6)])
    original = AsyncClient.wait

    async def broken(self: AsyncClient, task: Any, **kw: Any) -> Any:
        waited = await original(self, task, **kw)
        # The engine waits on the line's Submission (a task id on a resumed run).
        if (
            getattr(task, "task_id", task) == first_task[0]
        ):  # a bug somewhere beneath, quoting a header
            raise RuntimeError(f"Illegal header value b'Bearer {key}'")
        return waited

    first_task: list[str] = []
    submit = AsyncClient.submit

    async def spy(self: AsyncClient, *args: Any, **kw: Any) -> Any:
        sub = await submit(self, *args, **kw)
        first_task[:] = first_task or [sub.task_id]
        return sub

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AsyncClient, "wait", broken)
        patch.setattr(AsyncClient, "submit", spy)
        report = run_batch(
            source, tmp_path / "out", client_factory=lambda: gw.async_client(api_key=key, **FAST)
        )
    assert report.exit_code == 3  # unfinished: run again
    assert report.counts == {"saved": 5, "running": 1}
    (logged,) = [r.getMessage() for r in caplog.records if "unexpected" in r.getMessage()]
    assert "unexpected RuntimeError at test_batch.py:" in logged
    assert "stays unfinished for the next run" in logged
    assert key not in caplog.text
    again = run_batch(
        source, tmp_path / "out", client_factory=lambda: gw.async_client(api_key=key, **FAST)
    )
    assert again.counts == {"saved": 6}
    assert gw.stats()["tasks_created"] == 6


class Hiding:
    """Wraps the gateway's answers: while ``on``, task queries answer as for an unknown task
    (404 task_not_found, the gateway's own body), ``first`` times per task if given, else
    every time; result downloads answer ``results`` (a status, or a whole answer) while it is
    set."""

    def __init__(self, gw: MockGateway, *, first: int | None = None) -> None:
        self.on, self.first = True, first
        self.results: int | MockResponse = 0
        self.seen: Counter[str] = Counter()
        self.handle = gw.handle
        gw.handle = self  # type: ignore[method-assign]

    def __call__(self, request: Any) -> Any:
        path = request.path.partition("?")[0]
        if isinstance(self.results, MockResponse) and "/results/" in path:
            return self.results
        if self.results and "/results/" in path:
            return MockResponse(self.results, b'{"error": {"code": "x", "message": "x"}}')
        if self.on and request.method == "GET" and "/v1/tasks/" in path:
            task_id = path.rsplit("/", 1)[1]
            self.seen[task_id] += 1
            if self.first is None or self.seen[task_id] <= self.first:
                unknown = path.rsplit("/", 1)[0] + "/999999999"
                return self.handle(dataclasses.replace(request, path=unknown))
        return self.handle(request)


def test_a_task_not_visible_at_once_after_its_submit_is_asked_again(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    hiding = Hiding(gw, first=2)  # as a replica that has not seen the new task yet
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(3)])
    report = batch(gw, source, tmp_path / "out")
    assert report.counts == {"saved": 3}
    assert len(hiding.seen) == 3  # every task was hidden, and asked for again
    assert all(n >= 3 for n in hiding.seen.values())
    assert gw.stats()["tasks_created"] == 3


def test_a_rerun_looks_again_at_unknown_tasks_and_dead_results_and_never_resubmits(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway()
    hiding = Hiding(gw)  # every query of every task: unknown
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(3)])
    first = batch(gw, source, tmp_path / "out")
    assert first.counts == {"failed": 3}
    assert {r["error"]["code"] for r in manifest(first)} == {"not_found"}
    assert all(n == 4 for n in hiding.seen.values())  # NOT_FOUND_TRIES, then the line fails
    hiding.on = False
    second = batch(gw, source, tmp_path / "out")  # looked at again: a query, not a submit
    assert second.counts == {"saved": 3}
    assert posts(gw) == 3
    assert gw.stats()["tasks_created"] == 3


def test_results_whose_links_died_are_looked_at_again_by_a_rerun(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    hiding = Hiding(gw)
    hiding.on, hiding.results = False, 410  # every link, fresh ones too, says "expired"
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(2)])
    first = batch(gw, source, tmp_path / "out")
    assert first.counts == {"expired": 2}
    hiding.results = 0  # the gateway serves them again after all
    second = batch(gw, source, tmp_path / "out")
    assert second.counts == {"saved": 2}
    assert len(list((tmp_path / "out").glob("*.png"))) == 2
    assert gw.stats()["tasks_created"] == 2


@pytest.mark.slow
def test_a_result_unreachable_for_a_while_is_left_for_the_next_run_not_expired(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway()
    hiding = Hiding(gw)
    hiding.on, hiding.results = False, 503
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": "p"}])
    first = batch(gw, source, tmp_path / "out", timeout=2.0)
    assert first.counts == {"downloading": 1}  # not expired: the link never said so
    assert first.exit_code == 3
    hiding.results = 0
    assert batch(gw, source, tmp_path / "out").counts == {"saved": 1}


def test_a_page_served_in_place_of_a_result_fails_the_line_until_a_rerun_saves_it(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway()
    hiding = Hiding(gw)
    page = MockResponse(
        200, b"<html>Sign in to the hotel Wi-Fi</html>", (("content-type", "text/html"),)
    )
    hiding.on, hiding.results = False, page
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": "p"}])
    first = batch(gw, source, tmp_path / "out")
    assert first.counts == {"failed": 1}
    (record,) = manifest(first)
    assert record["error"]["code"] == "not_an_image"
    assert not list((tmp_path / "out").glob("*.png"))
    hiding.results = 0
    second = batch(gw, source, tmp_path / "out")  # looked at again: saved, nothing resubmitted
    assert second.counts == {"saved": 1}
    assert posts(gw) == 1
