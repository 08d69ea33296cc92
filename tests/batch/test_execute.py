"""A planned run on the tracker's loop (``batch/_execute.py``): every line of a workspace's plan
submitted once, waited on and saved through the loop, its report, manifest and money; a guard
made from what the folder's ledger was charged; a refused plan that leaves no ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imggw_client import PollPolicy
from imggw_client.batch import BatchInputError
from imggw_client.batch._identity import FolderIdentity
from imggw_client.batch._ledger import Ledger
from imggw_client.batch._plan import BatchOptions
from imggw_client.batch._run import execute, local_guard
from imggw_client.batch._schema import LEDGER_NAME, RUNNING, SAVED, LineState
from imggw_client.batch._store import LocalStore, Workspace
from imggw_client.mock import MockGateway

from .ledgers import planned, row

pytestmark = pytest.mark.anyio
FAST = PollPolicy(initial_interval=0.01, max_interval=0.05)


def _workspace(folder: Path, ledger: Ledger) -> Workspace:
    identity = FolderIdentity(
        folder, surface="beta", derive=lambda: "run-1", new_run=False, key_fingerprint=None
    )
    return Workspace(folder, ledger, identity, LocalStore(folder), gallery=None)


async def test_every_line_goes_through_the_loop_once_and_is_reported(tmp_path: Path) -> None:
    gw = MockGateway(duration_min=0.01, duration_max=0.02)
    folder = tmp_path / "out"
    folder.mkdir()
    async with gw.async_client(poll=FAST) as client:
        with Ledger.open(folder) as ledger:
            report = await execute(
                ["a fox", "a cat", "an owl"],
                _workspace(folder, ledger),
                client=client,
                options=BatchOptions(concurrency=2),
            )
    assert report.counts == {LineState.SAVED: 3}
    assert gw.stats()["tasks_created"] == 3
    rows = [json.loads(line) for line in report.manifest.read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert all(r["files"] for r in rows)
    assert all((folder / f["path"]).is_file() for r in rows for f in r["files"])
    assert report.credits == sum(r["credits"] for r in rows)


async def test_a_refused_plan_sends_nothing_and_leaves_no_ledger(tmp_path: Path) -> None:
    gw = MockGateway()
    folder = tmp_path / "out"
    folder.mkdir()
    async with gw.async_client(poll=FAST) as client:
        with Ledger.open(folder) as ledger, pytest.raises(BatchInputError):
            await execute(
                [{"prompt": ""}], _workspace(folder, ledger), client=client, options=BatchOptions()
            )
    assert gw.stats()["tasks_created"] == 0
    assert not (folder / LEDGER_NAME).exists()


async def test_a_local_guard_starts_from_what_the_folders_run_was_charged(
    tmp_path: Path,
) -> None:
    rows = [row(1, SAVED, task_id="1", credits=6.0), row(2, RUNNING, task_id="2")]
    with planned(tmp_path, rows) as ledger:
        guard = local_guard(ledger, ledger.totals(), BatchOptions(max_credits=10.0))
        state = await guard.state()
    assert state.charged_total.credits == 6.0  # a cap holds across reruns
