"""A planned run on the tracker's loop (``batch/_run.py``): every line of a workspace's plan
submitted once, waited on and saved through the loop, its report, manifest and money; a guard
made from what the folder's ledger was charged; a refused plan that leaves no ledger; and what a
run tells while it goes (snapshots at most every quarter of a second unless forced, on a fake
clock, what each holds, and a resumed run's learned durations, seeded from its ledger).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from imggw_client import AsyncClient, PollPolicy, RateLimit
from imggw_client.batch import BatchInputError, _run
from imggw_client.batch._admission import Charge
from imggw_client.batch._identity import FolderIdentity
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._plan import BatchOptions
from imggw_client.batch._report import BatchProgress
from imggw_client.batch._run import Progress, execute, learn_from_ledger, local_guard
from imggw_client.batch._schema import LEDGER_NAME, RUNNING, SAVED, LineState
from imggw_client.batch._store import LocalStore, Workspace
from imggw_client.mock import MockGateway
from imggw_client.tracking._loop import DownloadQueue

from .ledgers import planned, row, run_lines

FAST = PollPolicy(initial_interval=0.01, max_interval=0.05)


def _workspace(folder: Path, ledger: Ledger) -> Workspace:
    identity = FolderIdentity(
        folder, surface="beta", derive=lambda: "run-1", new_run=False, key_fingerprint=None
    )
    return Workspace(folder, ledger, identity, LocalStore(folder), gallery=None)


@pytest.mark.anyio
@pytest.mark.gateway(duration_min=0.01, duration_max=0.02)
async def test_every_line_goes_through_the_loop_once_and_is_reported(
    gateway: MockGateway, tmp_path: Path
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    async with gateway.async_client(poll=FAST) as client:
        with Ledger.open(folder) as ledger:
            report = await execute(
                ["a fox", "a cat", "an owl"],
                _workspace(folder, ledger),
                client=client,
                options=BatchOptions(concurrency=2),
            )
    assert report.counts == {LineState.SAVED: 3}
    assert gateway.stats()["tasks_created"] == 3
    rows = [json.loads(line) for line in report.manifest.read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert all(r["files"] for r in rows)
    assert all((folder / f["path"]).is_file() for r in rows for f in r["files"])
    assert report.credits == sum(r["credits"] for r in rows)


@pytest.mark.anyio
async def test_a_refused_plan_sends_nothing_and_leaves_no_ledger(
    gateway: MockGateway, tmp_path: Path
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    async with gateway.async_client(poll=FAST) as client:
        with Ledger.open(folder) as ledger, pytest.raises(BatchInputError):
            await execute(
                [{"prompt": ""}], _workspace(folder, ledger), client=client, options=BatchOptions()
            )
    assert gateway.stats()["tasks_created"] == 0
    assert not (folder / LEDGER_NAME).exists()


def test_a_run_cancelled_as_asyncio_cancels_while_it_plans_stops_the_plan_first(
    gateway: MockGateway, tmp_path: Path
) -> None:
    # Ctrl-C under asyncio.run cancels the main task itself, past anyio's shield, while the
    # plan's thread still writes the ledger: closed under it, SQLite crashed the process.
    folder = tmp_path / "out"
    folder.mkdir()
    planning, cancelled = threading.Event(), threading.Event()
    read = []

    def lines() -> Iterator[dict[str, str]]:
        for n in range(100_000):
            if n == 100:
                planning.set()
                assert cancelled.wait(10), "the run was never cancelled"
            read.append(n)
            yield {"prompt": f"a lighthouse, take {n}"}

    async def main() -> None:
        async with gateway.async_client(poll=FAST) as client:
            with Ledger.open(folder) as ledger:
                run = asyncio.ensure_future(
                    execute(
                        lines(), _workspace(folder, ledger), client=client, options=BatchOptions()
                    )
                )
                await asyncio.get_running_loop().run_in_executor(None, planning.wait, 10)
                run.cancel()  # asyncio's own cancel, as its Ctrl-C handler sends
                cancelled.set()
                with pytest.raises(asyncio.CancelledError):
                    await run

    asyncio.run(main())
    assert len(read) < 100_000  # stopped, not planned to its end
    assert gateway.stats()["tasks_created"] == 0
    assert sorted(p.name for p in folder.iterdir()) == [".imggw-batch.lock"]  # no ledger, no .part


@pytest.mark.anyio
async def test_a_local_guard_starts_from_what_the_folders_run_was_charged(
    tmp_path: Path,
) -> None:
    rows = [row(1, SAVED, task_id="1", credits=6.0), row(2, RUNNING, task_id="2")]
    with planned(tmp_path, rows) as ledger:
        guard = local_guard(ledger, BatchOptions(max_credits=10.0))
        state = await guard.state()
    assert state.charged_total.credits == 6.0  # a cap holds across reruns


def client(**kw: object) -> AsyncClient:
    return AsyncClient(api_key="sk-test-progress-0001", base_url="http://127.0.0.1:9", **kw)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_snapshots_come_at_most_every_quarter_second_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(_run, "time", SimpleNamespace(monotonic=lambda: clock.now))
    seen: list[BatchProgress] = []
    with planned(tmp_path, [row(1), row(2)]) as ledger:
        run = run_lines(ledger, tmp_path)
        progress = Progress(seen.append, client(), run, DownloadQueue(), BatchOptions(), "beta")
        progress.report()
        clock.now += 0.1
        progress.report()  # too soon: nothing
        progress.report(force=True)
        clock.now += 0.2
        progress.report()  # 0.2 s after the forced one: still too soon
        clock.now += 0.05
        progress.report()
    assert len(seen) == 3
    Progress(None, client(), run, DownloadQueue(), BatchOptions(), "beta").report(force=True)


@pytest.mark.anyio
async def test_a_snapshot_holds_the_lines_money_budget_queue_and_guard(tmp_path: Path) -> None:
    with planned(tmp_path, [row(1), row(2), row(3), row(4, SAVED, task_id="4")]) as ledger:
        run = run_lines(ledger, tmp_path)
        run.charged(Charge(), Charge(4.0, 0.01))
        first = ledger.rows()[0]
        run.move(first, RUNNING)
        run.stopped_by = "max_credits"
        queue = DownloadQueue()
        soon = time.time() + 60
        options = BatchOptions(max_credits=100, max_cost=2.0)
        progress = Progress(
            None, client(rate_limit=RateLimit(submits_per_second=2)), run, queue, options, "beta"
        )
        async with anyio.create_task_group() as group:
            group.start_soon(queue.put, row(9, expires_at=soon))
            await anyio.wait_all_tasks_blocked()
            shot = progress.snapshot()
            group.cancel_scope.cancel()
    assert shot.total == 4
    assert shot.counts == {LineState.PENDING: 2, LineState.RUNNING: 1, LineState.SAVED: 1}
    assert shot.least_time_left == 1.0  # 2 lines to submit at 2 a second
    assert shot.awaiting_download == 1
    assert shot.soonest_expiry is not None
    assert abs(shot.soonest_expiry.timestamp() - soon) < 1e-3
    assert (shot.max_credits, shot.max_cost, shot.stopped_by) == (100, 2.0, "max_credits")
    assert (shot.credits, shot.cost, shot.finished_this_run, shot.typical_durations) == (
        4.0,
        0.01,
        0,
        {},
    )


@pytest.mark.anyio
async def test_a_resumed_runs_polls_start_from_the_durations_its_ledger_kept(
    tmp_path: Path,
) -> None:
    rows = [
        row(n, SAVED, task_id=str(n), submitted_at=1000.0 * n, completed_at=1000.0 * n + 8)
        for n in range(1, 6)
    ]
    rows.append(
        row(6, SAVED, task_id="6", resolution="4k", submitted_at=9000.0, completed_at=9030.0)
    )
    made = client()
    assert made.typical_durations("beta") == {}
    with planned(tmp_path, rows) as ledger:
        await learn_from_ledger(made, ledger)
    learned = made.typical_durations("beta")
    assert set(learned) == {"1k", "4k"}
    assert learned["1k"] <= 8.0 < learned["4k"] <= 30.0
    assert made.typical_durations("alpha") == {}
