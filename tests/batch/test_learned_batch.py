"""Batches and polls that learn (DESIGN 15): a line's wait is given its submission, so it
learns; the ledger keeps when each task was submitted and seen finished; a resumed run starts
warm from those durations, and the display shows what the polls go by."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from imggw_client import AsyncClient, PollPolicy, RetryPolicy
from imggw_client.batch import BatchProgress, run_batch
from imggw_client.batch._ledger import Ledger
from imggw_client.mock import MockGateway

from ..cli.helpers import CANARY, imggw

# Seconds a test: batches whose tasks take their real 0.2-0.3 s, run twice (the slow lane, tests/conftest.py).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.gateway(api_keys=[CANARY], duration_min=0.2, duration_max=0.3, seed=2),
]


FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.2),
    "retry": RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05),
}


def prompts(path: Path, count: int, start: int = 0) -> Path:
    lines = [{"prompt": f"prompt {i}", "id": i} for i in range(start, start + count)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def durations(out: Path) -> list[tuple[float | None, float | None]]:
    with sqlite3.connect(out / "ledger.sqlite") as db:
        return list(db.execute("SELECT submitted_at, completed_at FROM tasks ORDER BY line"))


def test_the_ledger_keeps_each_tasks_time_and_a_resumed_run_starts_warm(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    out = tmp_path / "out"
    with gw.serve() as url:
        factory = lambda: AsyncClient(api_key=CANARY, base_url=url, **FAST)  # noqa: E731
        began = time.monotonic()
        first = run_batch(
            prompts(tmp_path / "in.jsonl", 12),
            out,
            client_factory=factory,
            concurrency=12,
            gallery=False,
        )
        spent = time.monotonic() - began
        assert first.exit_code == 0
        times = durations(out)
        assert all(s is not None and c is not None for s, c in times)
        took = [c - s for s, c in times if s is not None and c is not None]
        # Each task's seconds, from its submit's answer to the answer that saw it done: more
        # than nothing and inside the run, however loaded the machine. Not at least what the
        # gateway took (0.2-0.3 s): a loop busy with eleven other lines reads a submit's answer
        # late (0.05 s was seen). How soon a wait sees a task done is the poll schedule's,
        # proved on a fake clock (tests/core/test_learned_waits.py).
        assert all(0 < t <= spent for t in took), (took, spent)

        # A rerun with more lines, in a new process as far as the client knows (a new one).
        seen: list[BatchProgress] = []
        again = run_batch(
            prompts(tmp_path / "in.jsonl", 24),
            out,
            client_factory=factory,
            concurrency=12,
            gallery=False,
            allow_changes=True,
            on_progress=seen.append,
        )
    assert again.exit_code == 0
    # Before any line of this run finished, it already knew what its tasks take.
    assert seen[0].finished_this_run == 0
    assert set(seen[0].typical_durations) == {"1k"}
    # The median of what the ledger kept, however long a loaded machine made the tasks: each
    # time t counts as "done between (t - the first poll's interval) / 1.25 and t"
    # (DurationModel.seed), and the median (rounded to ms) lies within those bounds.
    lowest = (min(took) - FAST["poll"].initial_interval) / 1.25
    assert lowest - 0.001 <= seen[0].typical_durations["1k"] <= max(took) + 0.001


def test_replayed_and_collected_tasks_teach_no_duration(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    with gw.serve() as url:
        client = AsyncClient(api_key=CANARY, base_url=url, **FAST)

        async def made_elsewhere() -> str:
            async with client:
                return (await client.submit("elsewhere")).task_id

        task_id = anyio.run(made_elsewhere)
        source = tmp_path / "in.jsonl"
        source.write_text(json.dumps({"task_id": task_id}) + "\n")
        factory = lambda: AsyncClient(api_key=CANARY, base_url=url, **FAST)  # noqa: E731
        report = run_batch(source, tmp_path / "out", client_factory=factory, gallery=False)
    assert report.exit_code == 0
    assert durations(tmp_path / "out") == [(None, durations(tmp_path / "out")[0][1])]
    with Ledger.open(tmp_path / "out") as ledger:
        assert ledger.durations(50) == {}


def test_the_display_says_how_long_tasks_take(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    with gw.serve() as url:
        run = imggw(
            "batch",
            str(prompts(tmp_path / "in.jsonl", 12)),
            "-o",
            str(tmp_path / "o"),
            "--base-url",
            url,
            "--concurrency",
            "12",
        )
    assert run.code == 0, run.err
    assert "tasks take about 0." in run.err  # e.g. "tasks take about 0.2 s (1k)"
    assert " s (1k)" in run.err


def test_a_replayed_task_keeps_no_submit_time_its_start_is_not_known(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    out = tmp_path / "out"
    with gw.serve() as url:
        factory = lambda: AsyncClient(api_key=CANARY, base_url=url, **FAST)  # noqa: E731
        source = prompts(tmp_path / "in.jsonl", 3)
        assert run_batch(source, out, client_factory=factory, gallery=False).exit_code == 0
        (out / "ledger.sqlite").unlink()  # lost: the rerun sends the same keys again
        for name in ("ledger.sqlite-wal", "ledger.sqlite-shm"):
            (out / name).unlink(missing_ok=True)
        assert run_batch(source, out, client_factory=factory, gallery=False).exit_code == 0
    assert gw.stats()["replays"] == 3
    assert [s for s, _ in durations(out)] == [None, None, None]
