"""What a batch leaves for the next run instead of losing it (DESIGN 18; issue 27 items 4, 5
and 11): no submit without room on the disk for its result, a query error never fails a paid
line, and no run waits forever on one task. Over loopback against the reference gateway, the
command line where it is the user's way in; the disk is a fake one, told to the engine."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from imggw_client import AsyncClient, PollPolicy, RetryPolicy, TaskStatus
from imggw_client._core import reasons, spec
from imggw_client.batch import (
    BatchOptions,
    BatchReport,
    StorageError,
    _admission,
    run_batch,
    run_shard,
)
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._schema import RUNNING, SUCCEEDED
from imggw_client.batch.scale._folder import charges
from imggw_client.batch.scale._storage import open_storage
from imggw_client.mock import MockGateway, MockRequest, MockResponse
from imggw_client.mock import _serving as serving

from ..cli.helpers import CANARY, imggw, imggw_batch

FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.05),
}
MiB = 1 << 20
QUERY = spec.of("beta").query_path.split("{")[0]  # /beta/v1/tasks/
TASK_ID = re.compile(rb'"task_?[iI]d"\s*:\s*"?(\d+)')


pytestmark = pytest.mark.gateway(api_keys=[CANARY], duration_min=0.02, duration_max=0.06)


def prompts(path: Path, *lines: str) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def batch(url: str, source: Path, out: Path, **options: Any) -> BatchReport:
    factory = lambda: AsyncClient(api_key=CANARY, base_url=url, **FAST)  # noqa: E731
    return run_batch(source, out, client_factory=factory, **options)


def manifest(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]


def submits(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if route.startswith("POST"))


def rows(folder: Path) -> list[Any]:
    """The ledger's rows, read by opening it as a run would: it fails if the lock is held."""
    with Ledger.open(folder) as ledger:
        return list(ledger.iter_rows())


def refused(reason: reasons.Reason) -> MockResponse:
    status, body = serving.error_body("beta", serving.refuse(reason))
    return MockResponse(status, body)


# ---------------------------------------------------------------------------- query errors


PROXY_400 = MockResponse(400, b"<html>400 Bad Request</html>", (("content-type", "text/html"),))


@pytest.mark.parametrize(
    "refusal", [refused(reasons.INSUFFICIENT_CREDITS), PROXY_400], ids=["402", "proxy-400"]
)
@pytest.mark.slow
def test_a_refused_status_query_leaves_the_paid_line_running_and_a_rerun_collects_it(
    make_gateway: Callable[..., MockGateway], refusal: MockResponse, tmp_path: Path
) -> None:
    # Issue 27 item 5: one 402 (a balance just spent) or a proxy's 400 on a status query failed
    # the paid line for good; reruns never asked again.
    gw = make_gateway()
    handle, refusals = gw.handle, [1]

    def refuse_one_query(request: MockRequest) -> MockResponse:
        if request.method == "GET" and request.path.startswith(QUERY) and refusals:
            refusals.pop()
            return refusal
        return handle(request)

    gw.handle = refuse_one_query  # type: ignore[method-assign]
    source, out = prompts(tmp_path / "in.txt", "a fox", "a hen"), tmp_path / "out"
    with gw.serve() as url:
        first = batch(url, source, out, concurrency=1)
        assert not refusals  # the gateway did refuse a query
        assert first.exit_code == 3  # unfinished, not failed
        assert first.counts == {"saved": 1, "running": 1}
        (left,) = [r for r in manifest(out) if r["status"] == "running"]
        assert left["task_id"] is not None
        assert left["error"] is None
        again = batch(url, source, out)
    assert again.exit_code == 0
    assert again.counts == {"saved": 2}
    assert gw.stats()["tasks_created"] == 2 == submits(gw)  # queried again, never resubmitted
    assert len(list(out.glob("*.png"))) == 2


@pytest.mark.slow
def test_a_refused_query_for_fresh_links_leaves_the_line_to_download_next_run(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway()
    handle, dead = gw.handle, [1]
    refusing = [False]

    def dead_link_then_402(request: MockRequest) -> MockResponse:
        if request.method == "GET" and request.path.startswith("/results/") and dead:
            dead.pop()
            refusing[0] = True  # the query for a fresh link comes next
            return MockResponse(403, b"forbidden", (("content-type", "text/plain"),))
        if refusing[0] and request.method == "GET" and request.path.startswith(QUERY):
            refusing[0] = False
            return refused(reasons.INSUFFICIENT_CREDITS)
        return handle(request)

    gw.handle = dead_link_then_402  # type: ignore[method-assign]
    source, out = prompts(tmp_path / "in.txt", "a fox"), tmp_path / "out"
    with gw.serve() as url:
        first = batch(url, source, out)
        assert first.counts == {"downloading": 1}
        assert first.exit_code == 3
        again = batch(url, source, out)
    assert again.counts == {"saved": 1}
    assert gw.stats()["tasks_created"] == 1


# ---------------------------------------------------------------------------- line timeout


class StuckTask:
    """The reference gateway, but the task of the prompt ``stuck`` runs until ``stuck`` is
    cleared (its queries answer ``running``, as a provider's hung job does)."""

    def __init__(self, gw: MockGateway, credits: float = 4.0) -> None:
        self.handle, self.stuck, self.task_id = gw.handle, True, ""
        self.credits = credits  # what it states while it runs

    def __call__(self, request: MockRequest) -> MockResponse:
        answer = self.handle(request)
        if request.method == "POST" and b'"stuck"' in request.body:
            found = TASK_ID.search(answer.body)
            assert found is not None
            self.task_id = found.group(1).decode()
        if self.stuck and request.method == "GET" and request.path == QUERY + self.task_id:
            view = serving.TaskView(
                self.task_id, TaskStatus.RUNNING, 50, (), self.credits, self.credits / 400, None
            )
            return MockResponse(200, serving.task_record("beta", view))
        return answer


@pytest.fixture
def stuck(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> Iterator[tuple[MockGateway, StuckTask, str]]:
    gw = make_gateway()
    wrapper = StuckTask(gw)
    gw.handle = wrapper  # type: ignore[method-assign]
    with gw.serve() as url:
        yield gw, wrapper, url


@pytest.mark.slow
def test_a_task_that_never_ends_is_left_running_and_the_run_ends(
    stuck: tuple[MockGateway, StuckTask, str], tmp_path: Path
) -> None:
    # Issue 27 item 11: a stuck task kept `imggw batch` running forever: no manifest, the
    # folder locked for the next cron run.
    gw, wrapper, url = stuck
    source, out = prompts(tmp_path / "in.txt", "a fox", "stuck", "a hen"), tmp_path / "out"
    first = batch(url, source, out, line_timeout=0.3)
    assert first.exit_code == 3
    assert first.counts == {"saved": 2, "running": 1}
    assert [r["status"] for r in manifest(out)] == ["succeeded", "running", "succeeded"]
    (left,) = [r for r in rows(out) if r.state is RUNNING]  # the lock is free: it opens
    assert left.task_id == wrapper.task_id
    assert left.idempotency_key  # its key kept, for the next run
    wrapper.stuck = False  # the task ends at last
    again = batch(url, source, out, line_timeout=0.3)
    assert again.exit_code == 0
    assert again.counts == {"saved": 3}
    assert submits(gw) == 3 == gw.stats()["tasks_created"]  # collected, not submitted again
    assert len(list(out.glob("*.png"))) == 3


@pytest.mark.slow
def test_a_shard_leaves_a_stuck_task_running_too(
    stuck: tuple[MockGateway, StuckTask, str], tmp_path: Path
) -> None:
    _, wrapper, url = stuck
    source, out = prompts(tmp_path / "in.txt", "a fox", "stuck"), tmp_path / "out"
    factory = lambda: AsyncClient(api_key=CANARY, base_url=url, **FAST)  # noqa: E731
    report = run_shard(source, out, index=1, count=1, client_factory=factory, line_timeout=0.3)
    assert report.exit_code == 3
    assert report.counts == {"saved": 1, "running": 1}
    wrapper.stuck = False
    again = run_shard(source, out, index=1, count=1, client_factory=factory, line_timeout=0.3)
    assert again.counts == {"saved": 2}


@pytest.mark.slow
def test_a_charge_of_0_kept_for_a_running_line_teaches_no_price(
    stuck: tuple[MockGateway, StuckTask, str], tmp_path: Path
) -> None:
    """What the next run's guard starts from (the ledger's, or on Dask the folder's, prices):
    a line left running with a charge of 0 stated is no price of 0."""
    _, wrapper, url = stuck
    wrapper.credits = 0.0
    out = tmp_path / "out"
    report = batch(url, prompts(tmp_path / "in.txt", "stuck"), out, line_timeout=0.3)
    assert report.counts == {"running": 1}
    with Ledger.open(out) as ledger:
        assert ledger.charges() == {}
    spent, prices = charges(open_storage(str(out)))
    assert prices == {}
    assert spent.credits == 0


@pytest.mark.slow
def test_line_timeout_on_the_command_line(
    stuck: tuple[MockGateway, StuckTask, str], tmp_path: Path
) -> None:
    _, _, url = stuck
    source, out = prompts(tmp_path / "in.txt", "stuck", "a hen"), tmp_path / "out"
    run = imggw_batch(source, out, url, "--line-timeout", "0.3")
    assert run.code == 3, run.err
    assert "still runs after 0.3 s" in run.err
    assert (out / "manifest.jsonl").is_file()
    bad = imggw("batch", str(source), "-o", str(out), "--line-timeout", "0", "--mock")
    assert bad.code == 2
    assert bad.err == ("error: --line-timeout must be a number > 0 (got '0'); nothing was sent\n")
    shown = imggw("batch", "--help").out
    assert f"[default: {BatchOptions().line_timeout:g}]" in " ".join(shown.split())


def test_the_sdk_refuses_a_bad_line_timeout() -> None:
    for value in (0, -1.0, float("inf"), float("nan"), True, "10"):
        with pytest.raises(ValueError, match="line_timeout"):
            BatchOptions(line_timeout=value)  # type: ignore[arg-type]
    assert BatchOptions(line_timeout=None).line_timeout is None  # no limit, if asked


# ---------------------------------------------------------------------------- disk


class FakeDisk:
    """A disk of ``size`` bytes on which each result saved takes ``per_result`` bytes."""

    def __init__(self, size: int, per_result: int) -> None:
        self.size, self.per_result, self.asked = size, per_result, 0

    def __call__(self, folder: Path) -> int:
        self.asked += 1
        return self.size - self.per_result * len(list(folder.glob("*.png")))


@pytest.mark.slow
def test_no_line_is_submitted_without_room_for_its_result(
    make_gateway: Callable[..., MockGateway], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 27 item 4: a batch submitted every line before it found the disk full. Here a 10
    # MiB disk whose results take 3 MiB each, 4 MiB kept free for each 1k result to come: two
    # go, a third once they are saved, then there is no room for a fourth.
    disk = FakeDisk(10 * MiB, 3 * MiB)
    monkeypatch.setattr(_admission, "free_bytes", disk)
    gw = make_gateway()
    source = prompts(tmp_path / "in.txt", *(f"prompt {i}" for i in range(10)))
    out = tmp_path / "out"
    with gw.serve() as url:
        with pytest.raises(StorageError) as raised:
            batch(url, source, out, concurrency=4)
        assert raised.value.code == _admission.NO_ROOM
        assert str(out) in raised.value.message
        assert "1.0 MiB free" in raised.value.message
        assert "may need about 4 MiB" in raised.value.message
        assert gw.stats()["tasks_created"] == 3
        assert len(list(out.glob("*.png"))) == 3  # what was paid for is saved
        statuses = [r["status"] for r in manifest(out)]
        assert statuses == ["succeeded"] * 3 + ["pending"] * 7
        monkeypatch.setattr(_admission, "free_bytes", FakeDisk(1 << 40, 3 * MiB))  # room again
        again = batch(url, source, out)
    assert again.exit_code == 0
    assert gw.stats()["tasks_created"] == 10


@pytest.mark.slow
def test_a_full_disk_is_exit_4_naming_the_folder_and_the_room(
    make_gateway: Callable[..., MockGateway], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 70 MiB free: one 4k result (64 MiB kept free for it) fits; once saved (30 MiB), the
    # next does not.
    monkeypatch.setattr(_admission, "free_bytes", FakeDisk(70 * MiB, 30 * MiB))
    gw = make_gateway()
    out = tmp_path / "out"
    lines = [{"prompt": f"big {i}", "resolution": "4k", "aspect_ratio": "16:9"} for i in range(4)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with gw.serve() as url:
        run = imggw_batch(source, out, url)
    assert run.code == 4, run.err
    (error,) = [line for line in run.err.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: {out} has 40.0 MiB free;")
    assert "the results of the next line may need about 64 MiB" in error
    assert "make room, then run the same command to resume" in error
    assert gw.stats()["tasks_created"] == 1
    assert len(list(out.glob("*.png"))) == 1
    assert [r["status"] for r in manifest(out)] == ["succeeded"] + ["pending"] * 3


@pytest.mark.slow
def test_results_still_to_save_count_against_the_room(
    make_gateway: Callable[..., MockGateway], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun counts the lines an earlier run left downloading: their results come first."""
    gw = make_gateway()
    source = prompts(tmp_path / "in.txt", "a fox", "a hen")
    out = tmp_path / "out"
    with gw.serve() as url:
        assert batch(url, source, out).exit_code == 0
        with Ledger.open(out) as ledger:  # as if the files were lost: both to download again
            for row in ledger.iter_rows():
                row.state = SUCCEEDED
                ledger.save_now(row)
        for png in out.glob("*.png"):
            png.unlink()
        source.write_text("a fox\na hen\na cow\n")
        # 10 MiB: room for a third line's result (4), not for it beside the two to save (12).
        monkeypatch.setattr(_admission, "free_bytes", FakeDisk(10 * MiB, 4 * MiB))
        with pytest.raises(StorageError, match=r"has 2\.0 MiB free"):
            batch(url, source, out, allow_changes=True)
    assert gw.stats()["tasks_created"] == 2  # the third line was not sent
    assert len(list(out.glob("*.png"))) == 2


def test_a_folder_whose_free_space_cannot_be_told_is_not_stopped(
    make_gateway: Callable[..., MockGateway], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_admission, "free_bytes", lambda folder: None)
    gw = make_gateway()
    with gw.serve() as url:
        report = batch(url, prompts(tmp_path / "in.txt", "a", "b"), tmp_path / "out")
    assert report.exit_code == 0


def test_the_real_probe_tells_the_free_space_or_nothing(tmp_path: Path) -> None:
    free = _admission.free_bytes(tmp_path)
    assert free is not None
    assert abs(free - shutil.disk_usage(tmp_path).free) < 64 * MiB
    assert _admission.free_bytes(tmp_path / "missing") is None
